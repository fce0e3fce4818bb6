# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels for the paged KV pool: store new K/V rows, and extend (prefill) attention.

Decode attention (split along the sequence) lives in `triton_decode.py`.

All kernels read the pool as a flat (num_slots, num_kv_heads, head_dim) tensor, slot =
page_id * page_size + offset, and page tables as a padded 2-D int32 tensor (batch, max_pages).
Inputs may be fp16, bf16 or fp32; dot products and softmax accumulate in fp32.

On CPU the kernels run only under Triton's interpreter: set `TRITON_INTERPRET=1` in the
environment BEFORE `triton` is first imported (the tests' conftest does). On CUDA they compile.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


def interpreter_upcast(dtype: torch.dtype) -> bool:
    """The interpreter's tl.dot misreads bf16 operands (triton 3.9): upcast them to fp32 there.
    Compiled kernels keep bf16 operands with fp32 accumulation."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: true fp32 products (GPU default would be tf32); 16-bit inputs ignore it.
    return "ieee" if dtype == torch.float32 else "tf32"


def pad_page_tables(page_tables: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """List of int64 page-id tensors -> (batch, max_pages) int32, zero padded."""
    max_pages = max((len(t) for t in page_tables), default=1) or 1
    out = torch.zeros((len(page_tables), max_pages), dtype=torch.int32)
    for i, table in enumerate(page_tables):
        out[i, : len(table)] = table.to(torch.int32)
    return out.to(device)


# ----- store ----------------------------------------------------------------------------------


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_k_row, stride_v_row, stride_cache_slot,
                     ROW_SIZE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    # A negative slot marks a padding row (static decode batches): nothing is stored for it.
    mask = offs < tl.where(slot >= 0, ROW_SIZE, 0)
    k = tl.load(k_ptr + row.to(tl.int64) * stride_k_row + offs, mask=mask)
    v = tl.load(v_ptr + row.to(tl.int64) * stride_v_row + offs, mask=mask)
    tl.store(k_cache_ptr + slot * stride_cache_slot + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * stride_cache_slot + offs, v, mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: (N, Hkv, D); k_cache, v_cache: (num_pages, page_size, Hkv, D) contiguous;
    slot_mapping: (N,) int. Writes row i of k/v to slot slot_mapping[i]; rows whose slot is
    negative are skipped (padding)."""
    num_rows = k.shape[0]
    if num_rows == 0:
        return
    k2 = k.reshape(num_rows, -1)
    v2 = v.reshape(num_rows, -1)
    if k2.stride(1) != 1:
        k2 = k2.contiguous()
    if v2.stride(1) != 1:
        v2 = v2.contiguous()
    row_size = k2.shape[1]
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    assert k_cache.shape[2] * k_cache.shape[3] == row_size
    _store_kv_kernel[(num_rows,)](
        k2, v2, k_cache, v_cache, slot_mapping, k2.stride(0), v2.stride(0), row_size,
        ROW_SIZE=row_size, BLOCK=triton.next_power_of_2(row_size))


# ----- extend ---------------------------------------------------------------------------------


@triton.jit
def load_kv_block(k_cache_ptr, v_cache_ptr, page_table_ptr, seq, stride_pt, pos, mask_n, kv_head,
                  stride_cache_slot, stride_cache_head, offs_d, mask_d,
                  PAGE_SIZE: tl.constexpr, UPCAST: tl.constexpr):
    """K and V rows (BLOCK_N, BLOCK_D) of one KV head at token positions `pos` of sequence
    `seq`, found through its page table; masked rows and columns read as 0."""
    page = tl.load(page_table_ptr + seq * stride_pt + pos // PAGE_SIZE, mask=mask_n, other=0)
    slot = page.to(tl.int64) * PAGE_SIZE + (pos % PAGE_SIZE)
    kv_off = slot[:, None] * stride_cache_slot + kv_head * stride_cache_head + offs_d[None, :]
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def _extend_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
                   q_start_ptr, extend_len_ptr, context_len_ptr, page_table_ptr, tree_ptr,
                   sm_scale_log2,
                   stride_q_row, stride_q_head, stride_o_row, stride_o_head,
                   stride_cache_slot, stride_cache_head, stride_pt,
                   GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr, TREE: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    block_m = tl.program_id(2)
    extend_len = tl.load(extend_len_ptr + seq)
    if block_m * BLOCK_M >= extend_len:
        return
    context_len = tl.load(context_len_ptr + seq)
    q_start = tl.load(q_start_ptr + seq).to(tl.int64)
    kv_head = head // GROUP
    prefix_len = context_len - extend_len

    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < extend_len
    mask_d = offs_d < HEAD_DIM
    q_rows = q_start + offs_m.to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_q_row + head * stride_q_head + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = prefix_len + offs_m  # absolute key position of each query (bottom-right causal)
    if TREE:
        # Each row's tree mask (0: causal): bit j lets it see the step's row j.
        tree = tl.load(tree_ptr + q_rows, mask=mask_m, other=0)
        causal_row = tree == 0

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = tl.minimum(context_len, prefix_len + (block_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        pos = start + offs_n
        mask_n = pos < end
        k, v = load_kv_block(k_cache_ptr, v_cache_ptr, page_table_ptr, seq, stride_pt, pos,
                             mask_n, kv_head, stride_cache_slot, stride_cache_head, offs_d,
                             mask_d, PAGE_SIZE, UPCAST)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale_log2
        visible = mask_n[None, :] & (pos[None, :] <= q_pos[:, None])
        if TREE:
            step_row = pos - prefix_len  # < 0: the prefix, which every row sees
            shift = tl.minimum(tl.maximum(step_row, 0), 62).to(tl.int64)
            bit = (tree[:, None] >> shift[None, :]) & 1
            visible = visible & ((step_row[None, :] < 0) | causal_row[:, None] | (bit != 0))
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_o_row + head * stride_o_head + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     out: torch.Tensor, q_starts: torch.Tensor, extend_lens: torch.Tensor,
                     context_lens: torch.Tensor, page_table: torch.Tensor, max_extend_len: int,
                     sm_scale: float | None = None, tree_masks: torch.Tensor | None = None
                     ) -> None:
    """Causal attention of each sequence's new rows over its paged context (which already holds
    the new rows' K/V). q, out: (N, Hq, D); caches (num_pages, page_size, Hkv, D);
    q_starts / extend_lens / context_lens: (B,) int32; page_table: (B, max_pages) int32.

    `tree_masks`: int64 (N,) on q's device, one tree mask per row of q (engine.attention.tree;
    0: a causal row): row t of a sequence of T sees its prefix (positions < context_len - T)
    and the step's row j iff bit j of its entry; None: every row causal."""
    num_seqs = extend_lens.shape[0]
    if num_seqs == 0 or max_extend_len == 0:
        return
    num_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert num_heads % num_kv_heads == 0 and q.stride(2) == 1 and out.stride(2) == 1
    scale = (head_dim ** -0.5) if sm_scale is None else sm_scale
    block_d = triton.next_power_of_2(head_dim)
    block_m = 64 if block_d <= 128 else 32
    block_n = 64 if block_d <= 128 else 32
    grid = (num_seqs, num_heads, triton.cdiv(max_extend_len, block_m))
    _extend_kernel[grid](
        q, k_cache, v_cache, out, q_starts, extend_lens, context_lens, page_table,
        extend_lens if tree_masks is None else tree_masks, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(1), k_cache.stride(2), page_table.stride(0),
        GROUP=num_heads // num_kv_heads, PAGE_SIZE=page_size, HEAD_DIM=head_dim,
        BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n, PRECISION=dot_precision(q.dtype),
        UPCAST=interpreter_upcast(q.dtype), TREE=tree_masks is not None,
        num_warps=4, num_stages=2)
