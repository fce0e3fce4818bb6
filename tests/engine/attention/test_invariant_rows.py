"""A query row's attention has one set of bits however it is computed (csrc/row_math.h): decoded
alone, verified among drafts (a chain mask included), inside extends of several lengths and
chunkings with the prefix cached or computed in the same extend, beside unrelated sequences,
through the decode kernel (cpu_paged.paged_attention) or the extend kernel
(cpu_extend.paged_extend); fp32 and bf16 pools, grouped heads of 128, 64 and 40 dims, windows
and sinks. Compared as int32 bit patterns, no tolerance.

Each test runs on the kernels built from the working tree for this CPU (-march=native) and for
the lower classes this CPU can run: Cooper Lake (AVX512-BF16 dot products, as Zen 4 runs
them), Ice Lake (AVX-512, a bf16 pool widened), x86-64-v3 (AVX2, as Zen 3) and x86-64-v2 (plain
C). A build that does not compile fails the test; only a build this CPU cannot run skips."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from engine.attention import cpu_extend, cpu_paged
from engine.attention.base import PagedBatch
from engine.attention.cpu_extend import paged_extend
from engine.attention.cpu_invariant import InvariantCpuAttention
from engine.attention.cpu_paged import CpuPagedAttention, paged_attention
from engine.attention.spec import AttentionSpec
from engine.attention.tree import chain_mask, tree_mask_from_parents
from engine.kv_pool import KVLayout, KVPool
from tests.engine.attention.kernel_builds import ROOT, strict_build
from tests.engine.attention.test_cpu_paged import config

BUILDS = ("native", "cooperlake", "icelake-server", "x86-64-v3", "x86-64-v2")
PAGE_SIZE, SPLIT_LEN = 16, 256


@pytest.fixture(params=BUILDS)
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both kernels of one build from the working tree."""
    march = str(request.param)
    paged = strict_build(ROOT / "engine/attention/csrc/paged_cpu.c", march)
    extend = strict_build(ROOT / "engine/attention/csrc/extend_cpu.c", march)
    monkeypatch.setattr(cpu_paged, "kernel", lambda: paged)
    monkeypatch.setattr(cpu_extend, "kernel", lambda: extend)
    cpu_extend.extend_choice.cache_clear()
    yield march
    cpu_extend.extend_choice.cache_clear()


@dataclass
class Layer:
    """One pool layer of random K/V whose sequences own shuffled pages, and a query row for
    every position of every sequence (so any row can be computed in any way)."""

    k: torch.Tensor
    v: torch.Tensor
    tables: list[torch.Tensor]
    q: list[torch.Tensor]
    scale: float
    window: int | None
    sinks: torch.Tensor | None

    @classmethod
    def random(cls, heads: tuple[int, int, int], dtype: torch.dtype, lens: list[int],
               window: int | None, sinks: bool, seed: int) -> Layer:
        num_heads, num_kv_heads, head_dim = heads
        gen = torch.Generator().manual_seed(seed)
        counts = [-(-n // PAGE_SIZE) for n in lens]
        order = torch.randperm(sum(counts) + 3, generator=gen)
        slots = len(order) * PAGE_SIZE
        starts = torch.tensor([0, *counts]).cumsum(0).tolist()
        return cls(torch.randn(slots, num_kv_heads, head_dim, generator=gen).to(dtype),
                   torch.randn(slots, num_kv_heads, head_dim, generator=gen).to(dtype),
                   [order[a:b].clone() for a, b in zip(starts, starts[1:], strict=False)],
                   [torch.randn(n, num_heads, head_dim, generator=gen) for n in lens],
                   0.7 * head_dim**-0.5, window,
                   torch.randn(num_heads, generator=gen) if sinks else None)

    def _index(self, steps: list[tuple[int, int, int]]) -> tuple[torch.Tensor, ...]:
        """(q rows, pages, page_starts, context_lens, row counts) of `steps`: (sequence, first
        row position, end) each, the rows [first, end) of the sequence at context end."""
        tables = [self.tables[s] for s, _, _ in steps]
        pages = torch.cat(tables).contiguous()
        page_starts = torch.tensor([0, *[len(t) for t in tables]][:-1]).cumsum(0)
        return (torch.cat([self.q[s][a:b] for s, a, b in steps]).contiguous(), pages,
                page_starts, torch.tensor([b for _, _, b in steps]),
                torch.tensor([b - a for _, a, b in steps]))

    def decode_kernel(self, steps: list[tuple[int, int, int]], chains: bool = False,
                      masks: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of `steps` through the decode kernel in one call (`chains`: each step's
        rows under its chain mask, a tree verification that is a plain sequence; `masks`: one
        tree mask per row, 0 for a causal one)."""
        q, pages, page_starts, context_lens, counts = self._index(steps)
        if chains:
            masks = torch.cat([chain_mask(int(n)) for n in counts])
        row_starts = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        return paged_attention(q, self.k, self.v, pages, page_starts, context_lens, row_starts,
                               PAGE_SIZE, SPLIT_LEN, scale=self.scale, window=self.window,
                               sinks=self.sinks, masks=masks)

    def extend_kernel(self, steps: list[tuple[int, int, int]]) -> torch.Tensor:
        """The rows of `steps` through the extend kernel in one call."""
        q, pages, page_starts, context_lens, counts = self._index(steps)
        out = torch.full(q.shape, float("nan"))
        row_starts = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)[:-1]])
        paged_extend(q, self.k, self.v, pages, page_starts, context_lens, row_starts, counts,
                     PAGE_SIZE, out, scale=self.scale, window=self.window, sinks=self.sinks,
                     split_len=SPLIT_LEN)
        return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert torch.isfinite(got).all(), what
    differ = int((bits(got) != bits(want)).sum())
    assert differ == 0, f"{what}: {differ} elements differ (max {(got - want).abs().max():.3g})"


# (pool dtype, heads, window, sinks): the target model's 12/2 heads of 128 dims, SmolLM2's 9/3
# and Qwen2.5-0.5B's 14/2 of 64, and 40 dims (not a multiple of 16: the tails).
CASES = [(torch.float32, (12, 2, 128), None, False), (torch.bfloat16, (12, 2, 128), None, True),
         (torch.float32, (9, 3, 64), 300, True), (torch.bfloat16, (9, 3, 64), None, False),
         (torch.bfloat16, (14, 2, 64), 130, False), (torch.float32, (4, 1, 40), None, True)]


@pytest.mark.parametrize(("dtype", "heads", "window", "sinks"), CASES)
def test_a_rows_bits_do_not_depend_on_how_it_is_computed(
        build: str, dtype: torch.dtype, heads: tuple[int, int, int], window: int | None,
        sinks: bool) -> None:
    """Sequence 0: a prefix of 700 positions then 330 new rows; sequences 1 and 2 unrelated.
    The new rows' bits from one extend are the bits of every other way of computing them."""
    prefix, ctx = 700, 1030
    layer = Layer.random(heads, dtype, [ctx, 900, 40], window, sinks, seed=sum(heads))
    want = layer.extend_kernel([(0, prefix, ctx)])
    # The whole context prefilled in one extend (the prefix computed in the same call), and in
    # chunks of 1024.
    assert_same_bits(layer.extend_kernel([(0, 0, ctx)])[prefix:], want, "prefill")
    chunked = torch.cat([layer.extend_kernel([(0, 0, 1024)]),
                         layer.extend_kernel([(0, 1024, ctx)])])
    assert_same_bits(chunked[prefix:], want, "prefill in chunks of 1024")
    for chunk in (64, 256, 37):
        cuts = [*range(prefix, ctx, chunk), ctx]
        pieces = zip(cuts, cuts[1:], strict=False)
        got = torch.cat([layer.extend_kernel([(0, a, b)]) for a, b in pieces])
        assert_same_bits(got, want, f"chunks of {chunk}")
    # Beside unrelated sequences, before and after it in the call.
    beside = layer.extend_kernel([(1, 100, 900), (0, prefix, ctx), (2, 0, 40)])
    assert_same_bits(beside[800:800 + ctx - prefix], want, "extend beside others")
    # Decodes, one row each (beside other decodes and verifications, too).
    rows = [0, 1, 15, 16, 63, 64, 100, 255, 256, 300, 329]
    for t in rows:
        p = prefix + t
        assert_same_bits(layer.decode_kernel([(0, p, p + 1)])[0], want[t], f"decode of row {t}")
    calls = layer.decode_kernel([(1, 890, 900), *[(0, prefix + t, prefix + t + 1) for t in rows],
                                 (2, 39, 40)])
    assert_same_bits(calls[10:10 + len(rows)], want[rows], "decodes beside others")
    # Verifications of 2, 9 and 16 rows, plain and under a chain mask.
    for group, start in ((2, 0), (9, 57), (16, 240), (16, 314)):
        a, b = prefix + start, prefix + start + group
        sub = want[start:start + group]
        assert_same_bits(layer.decode_kernel([(0, a, b)]), sub, f"verification of {group}")
        if window is None:
            assert_same_bits(layer.decode_kernel([(0, a, b)], chains=True), sub,
                             f"chain-masked verification of {group}")
        mixed = layer.decode_kernel([(2, 30, 40), (0, a, b), (1, 895, 900)])
        assert_same_bits(mixed[10:10 + group], sub, f"verification of {group} beside others")


def _steps(pool: KVPool, backend: type[CpuPagedAttention], spec: AttentionSpec,
           tables: list[torch.Tensor], qkv: list[tuple[torch.Tensor, ...]], starts: list[int],
           cuts: list[int], beside: bool) -> torch.Tensor:
    """Sequence 0's new rows (qkv[0], from position starts[0]) in steps ending at `cuts`, each
    step a batch of its own through `backend` (which stores their K/V first); `beside`: one
    row of sequence 1 decoded in each step too. -> sequence 0's outputs."""
    outs, pos1 = [], starts[1]
    for a, b in zip([0, *cuts], cuts, strict=False):
        seqs = [(0, starts[0] + a, starts[0] + b, a, b)]
        if beside:
            seqs.append((1, pos1, pos1 + 1, pos1 - starts[1], pos1 - starts[1] + 1))
            pos1 += 1
        slots = []
        for s, first, end, _, _ in seqs:
            positions = torch.arange(first, end)
            slots.append(tables[s][positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE)
        batch = PagedBatch([end - first for _, first, end, _, _ in seqs],
                           [end for _, _, end, _, _ in seqs], torch.cat(slots),
                           [tables[s] for s, *_ in seqs])
        q, k, v = (torch.cat([qkv[s][i][x:y] for s, _, _, x, y in seqs]) for i in range(3))
        outs.append(backend(pool, batch)(spec, q, k, v)[: b - a])
    return torch.cat(outs)


@pytest.mark.parametrize(("dtype", "model_dtype", "window"), [
    (torch.float32, torch.float32, None), (torch.bfloat16, torch.float32, 150),
    (torch.bfloat16, torch.bfloat16, None)])
def test_backend_steps_give_one_set_of_bits(build: str, dtype: torch.dtype,
                                            model_dtype: torch.dtype, window: int | None) -> None:
    """Through the "cpu" backend, K/V stores included: 120 new rows after a cached prefix of
    500, in one extend, decoded one by one, in verification-sized steps of 9 and in prefill
    chunks of 50 (the extend kernel), alone or beside another sequence's decodes, get the same
    bits. The build's default path is row_math.h's everywhere but without AVX2, where
    `--deterministic`'s backend takes it."""
    path = cpu_extend.extend_choice(dtype, 64)[0]
    assert path == ("torch" if build == "x86-64-v2" else "c")
    backend = CpuPagedAttention if path == "c" else InvariantCpuAttention
    gen = torch.Generator().manual_seed(21)
    pool = KVPool(config(9, 3, 64), KVLayout(num_pages=96, page_size=PAGE_SIZE,
                                              bytes_per_page=0), dtype)
    pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=gen))
    pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=gen))
    order = torch.randperm(96, generator=gen)
    tables, starts = [order[:40].clone(), order[40:80].clone()], [500, 300]
    qkv = [tuple(torch.randn(120, n, 64, generator=gen).to(model_dtype) for n in (9, 3, 3))
           for _ in range(2)]
    sinks = torch.randn(9, generator=gen)
    spec = AttentionSpec(0, 0.1, window=window, sinks=sinks)

    def run(cuts: list[int], beside: bool) -> torch.Tensor:
        fresh = KVPool(config(9, 3, 64), pool.layout, dtype)
        fresh.k[0].copy_(pool.k[0])
        fresh.v[0].copy_(pool.v[0])
        return _steps(fresh, backend, spec, tables, qkv, starts, cuts, beside).float()

    want = run([120], False)
    assert_same_bits(run([120], True), want, "one extend beside a decode")
    assert_same_bits(run(list(range(1, 121)), False), want, "decodes")
    assert_same_bits(run(list(range(1, 121)), True), want, "decodes beside decodes")
    assert_same_bits(run([*range(9, 120, 9), 120], True), want, "steps of 9")
    assert_same_bits(run([50, 100, 120], True), want, "chunks of 50")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tree_rows_bits_do_not_depend_on_its_neighbours(build: str, dtype: torch.dtype) -> None:
    """A draft tree of 30 rows (over two tiles and a split's end) gets the same bits verified
    alone and beside a decode and a causal verification of other sequences."""
    layer = Layer.random((9, 3, 64), dtype, [770, 300, 500], None, True, seed=5)
    gen = torch.Generator().manual_seed(6)
    parents = [-1, *(int(torch.randint(0, t, (1,), generator=gen)) for t in range(1, 30))]
    tree = tree_mask_from_parents(parents)
    alone = layer.decode_kernel([(0, 740, 770)], masks=tree)
    zeros = torch.zeros(1 + 12, dtype=torch.int64)
    beside = layer.decode_kernel([(1, 299, 300), (0, 740, 770), (2, 488, 500)],
                                 masks=torch.cat([zeros[:1], tree, zeros[1:]]))
    assert_same_bits(beside[1:31], alone, "tree beside others")
    # Its first row sees only the prefix and itself: a decode's bits.
    assert_same_bits(alone[0], layer.decode_kernel([(0, 740, 741)])[0], "the root")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tree_row_has_the_bits_of_its_token_decoded_after_its_ancestors(
        build: str, dtype: torch.dtype) -> None:
    """Each row of a 30-row tree (over two tiles and a split's end) equals a decode of the same
    query after the prefix and its accepted ancestors only, as the engine computes the token
    once the verify accepts that path (the ancestors' K/V moved to the positions after the
    prefix): so tree drafting keeps greedy output."""
    layer = Layer.random((9, 3, 64), dtype, [770], None, True, seed=7)
    gen = torch.Generator().manual_seed(8)
    parents = [-1, *(int(torch.randint(0, t, (1,), generator=gen)) for t in range(1, 30))]
    prefix = 740
    verified = layer.decode_kernel([(0, prefix, 770)], masks=tree_mask_from_parents(parents))
    table = layer.tables[0]

    def slot(position: int) -> int:
        return int(table[position // PAGE_SIZE]) * PAGE_SIZE + position % PAGE_SIZE

    for row in range(30):
        path = [row]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()  # root ... row
        k, v, q = layer.k.clone(), layer.v.clone(), layer.q[0].clone()
        for depth, node in enumerate(path):
            k[slot(prefix + depth)] = layer.k[slot(prefix + node)]
            v[slot(prefix + depth)] = layer.v[slot(prefix + node)]
        end = prefix + len(path)
        q[end - 1] = layer.q[0][prefix + row]
        decoded = Layer(k, v, layer.tables, [q], layer.scale, layer.window,
                        layer.sinks).decode_kernel([(0, end - 1, end)])
        assert_same_bits(verified[row], decoded[0], f"tree row {row} (depth {len(path) - 1})")
