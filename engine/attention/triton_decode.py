# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Paged decode attention in Triton: one query token per sequence, split along the sequence.

Flash-decoding: program (seq, kv_head, split) attends the GROUP query heads that share one KV
head over its chunk of the context and writes a normalised partial output plus its log-sum-exp
(base 2); a second kernel merges the splits. Long contexts thus fill the GPU even at batch 1.
See `triton_kernels.py` for layouts, dtypes and the `TRITON_INTERPRET=1` rule on CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels import (
    LOG2E,
    dot_precision,
    interpreter_upcast,
    load_kv_block,
)

MIN_SPLIT_TOKENS = 256  # a split shorter than this costs more to merge than it saves
MAX_SPLITS = 32


@triton.jit
def _decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, part_out_ptr, part_lse_ptr,
                         q_row_ptr, context_len_ptr, page_table_ptr, sm_scale_log2,
                         split_len, stride_q_row, stride_q_head,
                         stride_cache_slot, stride_cache_head, stride_pt,
                         stride_po_seq, stride_po_head, stride_po_split,
                         stride_pl_seq, stride_pl_head,
                         GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                         PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_len_ptr + seq)
    q_row = tl.load(q_row_ptr + seq).to(tl.int64)
    start = split * split_len
    end = tl.minimum(context_len, start + split_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h
    q = tl.load(q_ptr + q_row * stride_q_row + heads[:, None] * stride_q_head + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_N):
        pos = block_start + offs_n
        mask_n = pos < end
        k, v = load_kv_block(k_cache_ptr, v_cache_ptr, page_table_ptr, seq, stride_pt, pos,
                             mask_n, kv_head, stride_cache_slot, stride_cache_head, offs_d,
                             mask_d, PAGE_SIZE, UPCAST)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale_log2
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    # An empty split (past the end of a shorter sequence) writes lse = -inf and zeros.
    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    po = (part_out_ptr + seq * stride_po_seq + heads[:, None] * stride_po_head
          + split * stride_po_split + offs_d[None, :])
    tl.store(po, out, mask=mask_h[:, None] & mask_d[None, :])
    tl.store(part_lse_ptr + seq * stride_pl_seq + heads * stride_pl_head + split, lse,
             mask=mask_h)


@triton.jit
def _decode_reduce_kernel(part_out_ptr, part_lse_ptr, out_ptr, q_row_ptr, num_splits,
                          stride_po_seq, stride_po_head, stride_po_split,
                          stride_pl_seq, stride_pl_head, stride_o_row, stride_o_head,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_S: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < num_splits
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(part_lse_ptr + seq * stride_pl_seq + head * stride_pl_head + offs_s,
                  mask=mask_s, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    weight = tl.exp2(lse - lse_max)  # split 0 always has keys, so lse_max is finite
    parts = tl.load(part_out_ptr + seq * stride_po_seq + head * stride_po_head
                    + offs_s[:, None] * stride_po_split + offs_d[None, :],
                    mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    q_row = tl.load(q_row_ptr + seq).to(tl.int64)
    tl.store(out_ptr + q_row * stride_o_row + head * stride_o_head + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=mask_d)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int,
                      target_programs: int = 264) -> int:
    """Enough splits to give ~2 programs per SM, none shorter than MIN_SPLIT_TOKENS."""
    by_len = triton.cdiv(max_context_len, MIN_SPLIT_TOKENS)
    by_occupancy = triton.cdiv(target_programs, max(1, num_seqs * num_kv_heads))
    return int(max(1, min(by_len, by_occupancy, MAX_SPLITS)))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     out: torch.Tensor, q_rows: torch.Tensor, context_lens: torch.Tensor,
                     page_table: torch.Tensor, max_context_len: int,
                     num_splits: int | None = None, sm_scale: float | None = None) -> None:
    """out[q_rows[i]] = attention of q[q_rows[i]] over sequence i's paged context.
    q, out: (N, Hq, D); caches (num_pages, page_size, Hkv, D); q_rows, context_lens: (B,) int32
    (every context_len >= 1); page_table: (B, max_pages) int32."""
    num_seqs = q_rows.shape[0]
    if num_seqs == 0:
        return
    num_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert num_heads % num_kv_heads == 0 and q.stride(2) == 1 and out.stride(2) == 1
    group = num_heads // num_kv_heads
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len)
    block_n = 64 if head_dim <= 128 else 32
    # Whole blocks per split, so only the last block of a sequence is partial.
    split_len = triton.cdiv(triton.cdiv(max_context_len, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_context_len, split_len)
    block_d = triton.next_power_of_2(head_dim)
    scale = (head_dim ** -0.5) if sm_scale is None else sm_scale
    part_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32,
                           device=q.device)
    part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32,
                           device=q.device)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, part_out, part_lse, q_rows, context_lens, page_table,
        scale * LOG2E, split_len, q.stride(0), q.stride(1),
        k_cache.stride(1), k_cache.stride(2), page_table.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        GROUP=group, PAGE_SIZE=page_size, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n,
        PRECISION=dot_precision(q.dtype),
        UPCAST=interpreter_upcast(q.dtype), num_warps=4, num_stages=2)
    _decode_reduce_kernel[(num_seqs, num_heads)](
        part_out, part_lse, out, q_rows, num_splits,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(num_splits))
