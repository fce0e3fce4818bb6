"""Each Triton kernel against a naive fp32 torch reference kept in this file.

CPU runs use Triton's interpreter (conftest sets TRITON_INTERPRET=1 before triton is imported),
so shapes are small: head dims 16/32/64, a few pages, one long (1000+ token) context.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from engine.attention.triton_decode import decode_attention  # noqa: E402
from engine.attention.triton_kernels import (  # noqa: E402
    extend_attention,
    pad_page_tables,
    store_kv,
)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET is off and there is no CUDA device", allow_module_level=True)
DEVICE = "cpu" if INTERPRET else "cuda"

# dtype -> (atol, rtol)
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (1.5e-2, 1e-2),
}
DTYPES = list(TOLERANCES)
HEADS = [(9, 3), (8, 2), (4, 1)]  # (num_heads, num_kv_heads): GQA ratios 3, 4, 4 (MQA)


def ref_paged_attn(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   extend_lens: list[int], context_lens: list[int],
                   page_tables: list[torch.Tensor]) -> torch.Tensor:
    """Loop over sequences, gather pages, repeat KV heads, fp32 einsum + explicit causal mask."""
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    scale = q.shape[2] ** -0.5
    outs = []
    start = 0
    for ext, ctx, table in zip(extend_lens, context_lens, page_tables, strict=True):
        qs = q[start : start + ext].float()
        start += ext
        k = k_cache[table].reshape(-1, num_kv_heads, k_cache.shape[3])[:ctx].float()
        v = v_cache[table].reshape(-1, num_kv_heads, v_cache.shape[3])[:ctx].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, k) * scale
        # Query i sits at key position ctx - ext + i and sees keys [0, ctx - ext + i].
        mask = torch.triu(torch.ones(ext, ctx, dtype=torch.bool), diagonal=ctx - ext + 1)
        scores.masked_fill_(mask.to(scores.device), float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
    assert page_size > 0
    return torch.cat(outs)


def make_case(heads: tuple[int, int], head_dim: int, page_size: int, extend_lens: list[int],
              context_lens: list[int], dtype: torch.dtype, seed: int = 0):  # noqa: ANN201
    """Random q and a random pool; each sequence gets shuffled (non-contiguous) pages."""
    gen = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads = heads
    pages_needed = [-(-c // page_size) for c in context_lens]
    num_pages = sum(pages_needed) + 3
    perm = torch.randperm(num_pages, generator=gen)
    tables, used = [], 0
    for n in pages_needed:
        tables.append(perm[used : used + n].to(torch.long))
        used += n
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(sum(extend_lens), num_heads, head_dim, generator=gen).to(dtype)
    return q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), tables


def int32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCES[dtype]
    err = (out.float() - ref).abs().max().item()
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol,
                               msg=f"{dtype}: max abs err {err:.3g}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_is_exact(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    num_pages, page_size, num_kv_heads, head_dim = 5, 4, 3, 16
    k_cache = torch.zeros(num_pages, page_size, num_kv_heads, head_dim, dtype=dtype).to(DEVICE)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([19, 0, 3, 4, 11, 7, 8], device=DEVICE)  # crosses page boundaries
    # v as a strided view (as the model's split of the fused qkv produces).
    kv = torch.randn(len(slots), 2, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    k, v = kv[:, 0], kv[:, 1]
    store_kv(k, v, k_cache, v_cache, slots)
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    assert torch.equal(flat_k[slots], k) and torch.equal(flat_v[slots], v)
    untouched = torch.ones(num_pages * page_size, dtype=torch.bool)
    untouched[slots.cpu()] = False
    assert not flat_k[untouched.to(DEVICE)].any() and not flat_v[untouched.to(DEVICE)].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS)
def test_decode_matches_reference(heads: tuple[int, int], dtype: torch.dtype) -> None:
    # Length-1 context, exact page fill (16 = 4 pages of 4), page+1, non-power-of-two lengths.
    context_lens = [1, 16, 17, 45, 130]
    head_dim, page_size = 32, 4
    q, k_cache, v_cache, tables = make_case(heads, head_dim, page_size, [1] * 5, context_lens,
                                            dtype)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, k_cache, v_cache, out, int32(list(range(5))), int32(context_lens),
                     pad_page_tables(tables, q.device), max(context_lens), num_splits=3)
    check(out, ref_paged_attn(q, k_cache, v_cache, [1] * 5, context_lens, tables), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_long_context_many_splits(dtype: torch.dtype) -> None:
    # 1000+ tokens over 16-token pages, split 8 ways, next to a short sequence whose later
    # splits are empty; q rows scattered (decode rows interleaved with others in a batch).
    context_lens = [1037, 5]
    q_full, k_cache, v_cache, tables = make_case((8, 2), 16, 16, [1, 1, 1], context_lens + [1],
                                                 dtype, seed=3)
    tables = tables[:2]
    out = torch.zeros_like(q_full)
    q_rows = [2, 0]
    decode_attention(q_full, k_cache, v_cache, out, int32(q_rows), int32(context_lens),
                     pad_page_tables(tables, q_full.device), max(context_lens), num_splits=8)
    ref = ref_paged_attn(q_full[q_rows], k_cache, v_cache, [1, 1], context_lens, tables)
    check(out[q_rows], ref, dtype)
    assert not out[1].any()  # rows not asked for are left alone


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS)
def test_extend_matches_reference(heads: tuple[int, int], dtype: torch.dtype) -> None:
    # Fresh prefill (ext == ctx), extend over a cached prefix across page boundaries, a single
    # new token, and an extend longer than one query block (70 > 64).
    extend_lens = [13, 7, 1, 70]
    context_lens = [13, 30, 9, 75]
    q, k_cache, v_cache, tables = make_case(heads, 16, 8, extend_lens, context_lens, dtype)
    out = torch.full_like(q, float("nan"))
    starts = [0, 13, 20, 21]
    extend_attention(q, k_cache, v_cache, out, int32(starts), int32(extend_lens),
                     int32(context_lens), pad_page_tables(tables, q.device), max(extend_lens))
    check(out, ref_paged_attn(q, k_cache, v_cache, extend_lens, context_lens, tables), dtype)


def test_extend_head_dim_64_long_prefix() -> None:
    extend_lens, context_lens = [33], [1100]
    q, k_cache, v_cache, tables = make_case((4, 1), 64, 16, extend_lens, context_lens,
                                            torch.float16, seed=5)
    out = torch.empty_like(q)
    extend_attention(q, k_cache, v_cache, out, int32([0]), int32(extend_lens),
                     int32(context_lens), pad_page_tables(tables, q.device), 33)
    check(out, ref_paged_attn(q, k_cache, v_cache, extend_lens, context_lens, tables),
          torch.float16)
