"""The fused CPU extend attention (two flash calls merged by log-sum-exp) equals the plain masked
SDPA reference, over GQA ratios, dtypes, empty and long prefixes, and odd lengths."""

from __future__ import annotations

import pytest
import torch

from engine.attention.cpu_flash import extend_attention
from engine.attention.dense import causal_attention

TOLERANCES = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
HEADS = [(9, 3), (8, 2), (4, 1), (4, 4)]


@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize(("prefix_len", "t_len"), [
    (0, 2), (0, 37), (1, 1), (15, 17), (16, 16), (333, 5), (1200, 257), (4001, 64)])
def test_extend_matches_masked_sdpa(dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                                    prefix_len: int, t_len: int) -> None:
    gen = torch.Generator().manual_seed(prefix_len * 31 + t_len)
    head_dim = 64
    s_len = prefix_len + t_len
    q = torch.randn(t_len, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(s_len, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(s_len, num_kv_heads, head_dim, generator=gen).to(dtype)
    expected = causal_attention(q.float(), k.float(), v.float())
    got = extend_attention(q, k, v)
    assert got.shape == (t_len, num_heads, head_dim) and got.dtype == dtype
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)


def test_extend_of_non_contiguous_gather() -> None:
    """The paged backend hands in gathered (fresh) tensors; a strided view works as well."""
    gen = torch.Generator().manual_seed(7)
    k = torch.randn(2, 300, 3, 64, generator=gen)[1]
    v = torch.randn(300, 2, 3, 64, generator=gen)[:, 0]
    q = torch.randn(40, 9, 64, generator=gen)
    torch.testing.assert_close(extend_attention(q, k, v), causal_attention(q, k, v),
                               atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
def test_gathered_decode_matches_per_sequence(num_heads: int, num_kv_heads: int,
                                              dtype: torch.dtype) -> None:
    from engine.attention.torch_paged import decode_attention, gathered_decode_attention

    gen = torch.Generator().manual_seed(num_heads)
    lens = [1, 17, 64, 5]
    max_len = max(lens)
    flat_k = torch.randn(300, num_kv_heads, 32, generator=gen).to(dtype)
    flat_v = torch.randn(300, num_kv_heads, 32, generator=gen).to(dtype)
    q = torch.randn(len(lens), num_heads, 32, generator=gen).to(dtype)
    slots = torch.randperm(300, generator=gen)[: len(lens) * max_len].view(len(lens), max_len)
    valid = torch.arange(max_len).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)
    slots = slots.masked_fill(~valid, 0)  # padding may name any slot
    got = gathered_decode_attention(q, flat_k, flat_v, slots, valid)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    for b, n in enumerate(lens):
        want = decode_attention(q[b : b + 1], flat_k[slots[b, :n]], flat_v[slots[b, :n]])
        torch.testing.assert_close(got[b : b + 1], want, atol=tol, rtol=tol)
