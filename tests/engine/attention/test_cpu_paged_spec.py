"""The CPU paged kernel's per-layer options (engine.attention.cpu_paged.paged_attention): a
softmax scale, a sliding window and attention sinks (Gemma 3, gpt-oss), against a plain torch
reference written the way transformers' eager attention computes them, on random pools with
pages out of order: fp32 and bf16 KV, grouped heads, 32/64/128-dim heads, decode and
verification rows, windows shorter than a page up to longer than the context.

Each test runs on three builds of the same sources: the installed one (-march=native: the
AVX-512 grouped pass for 64-dim heads on a machine that has it), one for x86-64-v3 (the AVX2
path) and one for baseline x86-64 (the scalar path). The latter two are compiled here, once,
into a cache under the temp dir (about a second each)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from engine.attention import cpu_paged
from engine.attention.cpu_paged import paged_attention
from tests.engine.attention.kernel_builds import ROOT, use_build

SOURCE = ROOT / "engine/attention/csrc/paged_cpu.c"
BUILDS = ("native", "x86-64-v3", "x86-64")


@pytest.fixture(params=BUILDS)
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Routes paged_attention to one build of the kernel."""
    return use_build(str(request.param), cpu_paged, SOURCE, monkeypatch)


class Batch:
    """Sequences of (rows, context) over a random pool: every sequence's pages are distinct
    and shuffled through the pool."""

    def __init__(self, seqs: list[tuple[int, int]], heads: tuple[int, int, int],
                 page_size: int, dtype: torch.dtype, gen: torch.Generator) -> None:
        num_heads, num_kv_heads, head_dim = heads
        self.seqs, self.page_size = seqs, page_size
        counts = [-(-ctx // page_size) for _, ctx in seqs]
        order = torch.randperm(sum(counts) + 8, generator=gen)  # some pages belong to nobody
        num_slots = len(order) * page_size
        self.k = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype)
        self.v = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype)
        starts = [0]
        for count in counts:
            starts.append(starts[-1] + count)
        self.tables = [order[a:b].clone() for a, b in zip(starts, starts[1:], strict=False)]
        num_rows = sum(t for t, _ in seqs)
        self.q = torch.randn(num_rows, num_heads, head_dim, generator=gen).to(dtype)
        self.row_starts = torch.tensor([0, *torch.tensor([t for t, _ in seqs]).cumsum(0)],
                                       dtype=torch.int64)
        self.context_lens = torch.tensor([ctx for _, ctx in seqs], dtype=torch.int64)

    def first_visible(self, i: int, window: int | None) -> int:
        """The first position that any row of sequence i sees."""
        rows, ctx = self.seqs[i]
        return 0 if window is None else max(0, ctx - rows - window + 1)

    def run(self, split_len: int, **options: Any) -> torch.Tensor:
        pages = torch.cat(self.tables).contiguous()
        page_starts = torch.tensor([0, *[len(t) for t in self.tables]][:-1],
                                   dtype=torch.int64).cumsum(0)
        return paged_attention(self.q, self.k, self.v, pages, page_starts, self.context_lens,
                               self.row_starts, self.page_size, split_len, **options)

    def reference(self, scale: float | None = None, window: int | None = None,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        """transformers' eager attention (gpt-oss's, for the sinks) per sequence, in fp64 over
        the positions some row sees (the others may be garbage)."""
        num_heads, head_dim = self.q.shape[1:]
        group = num_heads // self.k.shape[1]
        scale = head_dim**-0.5 if scale is None else scale
        outs = []
        for i, (rows, ctx) in enumerate(self.seqs):
            first = self.first_visible(i, window)
            positions = torch.arange(first, ctx)
            slots = self.tables[i][positions // self.page_size] * self.page_size \
                + positions % self.page_size
            k = self.k[slots].double().repeat_interleave(group, dim=1)
            v = self.v[slots].double().repeat_interleave(group, dim=1)
            start = int(self.row_starts[i])
            q = self.q[start:start + rows].double()
            scores = torch.einsum("thd,jhd->htj", q, k) * scale  # (Hq, T, keys)
            at = torch.arange(ctx - rows, ctx)[:, None]
            visible = positions[None, :] <= at
            if window is not None:
                visible &= positions[None, :] > at - window
            scores = scores.masked_fill(~visible, float("-inf"))
            if sinks is not None:
                column = sinks.double().view(-1, 1, 1).expand(num_heads, rows, 1)
                logits = torch.cat([scores, column], dim=-1)
                logits = logits - logits.max(dim=-1, keepdim=True).values
                probs = torch.softmax(logits, dim=-1)[..., :-1]
            else:
                probs = torch.softmax(scores, dim=-1)
            outs.append(torch.einsum("htj,jhd->thd", probs, v))
        return torch.cat(outs).to(self.q.dtype)

    def invalidate_before_windows(self, window: int) -> None:
        """Page ids wholly before each sequence's first visible position become -1 or a page
        full of NaN (one the first sequence no longer needs), as a long context's pages may
        be; at least one -1 is set."""
        spare = int(self.tables[0][0])
        self.k[spare * self.page_size:(spare + 1) * self.page_size] = float("nan")
        self.v[spare * self.page_size:(spare + 1) * self.page_size] = float("nan")
        for i, table in enumerate(self.tables):
            before = self.first_visible(i, window) // self.page_size
            table[:before:2] = -1
            table[1:before:2] = spare
        assert (torch.cat(self.tables) == -1).any()

    def poison_before_windows(self, window: int) -> None:
        """Fills the pages wholly before each sequence's first visible position with NaN."""
        for i, table in enumerate(self.tables):
            for page in table[: self.first_visible(i, window) // self.page_size]:
                start = int(page) * self.page_size
                self.k[start:start + self.page_size] = float("nan")
                self.v[start:start + self.page_size] = float("nan")


# Decodes (1 row) and verifications (up to 16 rows), contexts of 1, 17, 700 and 4000.
SEQS = [(1, 1), (1, 17), (16, 17), (5, 700), (1, 700), (9, 4000), (1, 4000), (16, 4000)]


def tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 2e-2


@pytest.mark.parametrize(("dtype", "heads", "page_size", "split_len", "window", "sink", "scale"), [
    # Sinks and a custom scale without a window; the grouped 64-dim pass (9 = 3 x 3 heads).
    (torch.float32, (9, 3, 64), 16, 256, None, True, 0.3),
    # Windows shorter than a page, one page, and one spanning several splits.
    (torch.float32, (9, 3, 64), 16, 64, 5, False, None),
    (torch.float32, (9, 3, 64), 16, 64, 16, True, None),
    (torch.float32, (8, 1, 128), 16, 40, 300, True, 0.05),  # splits not on pages or tiles
    (torch.float32, (4, 4, 32), 8, 256, 1, False, None),  # each row sees itself only
    (torch.float32, (8, 1, 64), 16, 64, 100, True, 1),
    (torch.float32, (9, 3, 64), 16, 256, 5000, True, None),  # longer than any context
    (torch.bfloat16, (9, 3, 64), 16, 64, 100, True, None),
    (torch.bfloat16, (8, 1, 128), 16, 256, 17, True, 0.2),
    (torch.bfloat16, (9, 3, 32), 8, 128, None, True, None),
    (torch.bfloat16, (8, 1, 64), 16, 256, 700, False, None),
])
def test_options_match_reference(build: str, dtype: torch.dtype, heads: tuple[int, int, int],
                                 page_size: int, split_len: int, window: int | None,
                                 sink: bool, scale: float | None) -> None:
    gen = torch.Generator().manual_seed(0)
    batch = Batch(SEQS, heads, page_size, dtype, gen)
    sinks = 2 * torch.randn(heads[0], generator=gen) if sink else None
    if window is not None:
        # The pages before every row's window are not read: garbage there changes nothing.
        batch.poison_before_windows(window)
    got = batch.run(split_len, scale=scale, window=window, sinks=sinks)
    want = batch.reference(scale, window, sinks)
    assert got.dtype == dtype and torch.isfinite(got).all()
    tol = tolerance(dtype)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pages_before_the_window_are_never_read(build: str, dtype: torch.dtype) -> None:
    """Page ids wholly before p_first - W + 1 may be invalid (-1) or a reused page (here full
    of NaN): the kernel never dereferences them, so a long context costs O(window)."""
    gen = torch.Generator().manual_seed(5)
    window = 40
    batch = Batch([(1, 4000), (9, 3000), (16, 1000), (1, 57)], (9, 3, 64), 16, dtype, gen)
    batch.invalidate_before_windows(window)
    sinks = torch.randn(9, generator=gen)
    got = batch.run(64, window=window, sinks=sinks)
    assert torch.isfinite(got).all()
    want = batch.reference(None, window, sinks)
    tol = tolerance(dtype)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 32])
def test_decode_row_equals_its_verification_row(build: str, dtype: torch.dtype,
                                                head_dim: int) -> None:
    """With a window and sinks, a row verified among 9 gets the same bits as the same row
    decoded alone (speculative decoding must not change greedy output): the splits and tiles
    stay on a grid from position 0, whatever the window."""
    gen = torch.Generator().manual_seed(11)
    rows, ctx, window = 9, 1500, 130
    verify = Batch([(rows, ctx)], (9, 3, head_dim), 16, dtype, gen)
    sinks = torch.randn(9, generator=gen)
    both = verify.run(64, window=window, sinks=sinks)
    for t in range(rows):
        decode = copy.copy(verify)  # the same pool and pages, row t alone
        decode.q = verify.q[t:t + 1]
        decode.row_starts = torch.tensor([0, 1])
        decode.context_lens = torch.tensor([ctx - rows + t + 1])
        one = decode.run(64, window=window, sinks=sinks)
        assert torch.equal(one[0], both[t]), f"row {t}"


def test_window_past_the_context_is_full_causal(build: str) -> None:
    gen = torch.Generator().manual_seed(2)
    batch = Batch(SEQS, (9, 3, 64), 16, torch.float32, gen)
    full = batch.run(256)
    assert torch.equal(batch.run(256, window=4000), full)  # every row sees all its past
    assert torch.equal(batch.run(256, window=10**9), full)
    assert torch.equal(batch.run(256, scale=64**-0.5), full)


def test_invalid_options_raise() -> None:
    if cpu_paged.kernel() is None:
        pytest.skip("the CPU kernel is not built")
    batch = Batch([(1, 20)], (4, 2, 32), 8, torch.float32, torch.Generator().manual_seed(0))
    bad: list[tuple[type[Exception], dict[str, Any]]] = [
        (ValueError, {"window": 0}),
        (ValueError, {"window": -3}),
        (TypeError, {"window": 2.5}),
        (TypeError, {"window": True}),
        (TypeError, {"scale": "0.1"}),
        (ValueError, {"scale": float("nan")}),
        (ValueError, {"scale": float("inf")}),
        (TypeError, {"sinks": [0.0] * 4}),
        (TypeError, {"sinks": torch.zeros(4, dtype=torch.float64)}),
        (TypeError, {"sinks": torch.zeros(4, dtype=torch.bfloat16)}),
        (ValueError, {"sinks": torch.zeros(2)}),  # one per KV head, not per query head
        (ValueError, {"sinks": torch.zeros(1, 4)}),
        (ValueError, {"sinks": torch.zeros(8)[::2]}),
        (ValueError, {"sinks": torch.zeros(4, device="meta")}),
    ]
    for error, options in bad:
        with pytest.raises(error, match="paged_attention"):
            batch.run(16, **options)
