"""Tree attention masks (`PagedBatch.tree_masks`, EAGLE-3 tree verification) in every backend
that honours them: torch, torch_sdpa, the CPU paged kernel (the installed build, and its AVX2
and scalar builds), cpu_invariant and Triton (interpreted on CPU). One batch mixes decodes,
causal extends (one longer than the kernel's rows) and random draft trees of 1 to 63 rows, with
and without a cached prefix, against a dense fp64 reference that builds each row's visibility
from the parents (ancestors and itself, plus the prefix); fp32 and bf16 pools, grouped heads,
sinks, contexts split over several work items. Then: a chain mask is the causal result bit for
bit in the kernel, and a tree row attends exactly as its own path decoded as a plain sequence.
The helpers' and the backends' refusals are in test_tree_masks_checks.py."""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
import torch

from engine.attention import cpu_paged
from engine.attention.base import PagedBatch
from engine.attention.cpu_invariant import InvariantCpuAttention
from engine.attention.cpu_paged import CpuPagedAttention
from engine.attention.registry import get_backend
from engine.attention.spec import AttentionSpec
from engine.attention.tree import chain_mask, tree_mask_from_parents
from engine.kv_pool import KVLayout, KVPool
from tests.engine.attention.kernel_builds import ROOT, use_build
from tests.engine.attention.test_cpu_paged import config, make_batch

SOURCE = ROOT / "engine/attention/csrc/paged_cpu.c"
BACKENDS = ["torch", "torch_sdpa", "cpu", "cpu:x86-64-v3", "cpu:x86-64", "cpu_invariant",
            "triton"]
CPU_BUILDS = ["native", "x86-64-v3", "x86-64"]
# (rows, context, is a tree): decodes, causal extends (20 > the kernel's 16 rows), trees with
# a long prefix split over work items, none (12 of 12), one row, over two tiles, 63 rows.
SEQS = [(1, 300, False), (5, 700, False), (7, 1300, True), (1, 17, False), (12, 12, True),
        (20, 400, False), (40, 600, True), (1, 50, True), (63, 100, True)]
TRITON_SEQS = [(1, 40, False), (5, 30, False), (7, 50, True), (12, 12, True), (1, 9, True),
               (20, 90, True)]
# (pool dtype, (num_heads, num_kv_heads, head_dim), sinks)
CASES = [(torch.float32, (9, 3, 64), False), (torch.float32, (8, 2, 32), True),
         (torch.bfloat16, (9, 3, 64), True), (torch.bfloat16, (4, 4, 32), False)]
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def backend_class(name: str, monkeypatch: pytest.MonkeyPatch) -> type:
    """The backend class `name` names, the CPU kernel routed to the named build and split into
    work items of 64 positions; skips what cannot run here."""
    if name.startswith("cpu"):
        build = name.split(":")[1] if ":" in name else "native"
        use_build(build, cpu_paged, SOURCE, monkeypatch)
        monkeypatch.setattr(CpuPagedAttention, "split_len", 64)
        return InvariantCpuAttention if name == "cpu_invariant" else CpuPagedAttention
    if name == "triton":
        pytest.importorskip("triton", reason="triton is not installed")
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            pytest.skip("the Triton test runs interpreted on CPU (TRITON_INTERPRET=1)")
    return get_backend(name)


def random_parents(n: int, rng: random.Random) -> list[int]:
    return [-1] + [rng.randrange(t) for t in range(1, n)]


def path(parents: list[int], t: int) -> list[int]:
    """Row t's ancestors and itself, root first, walked up the parents."""
    rows = []
    while t >= 0:
        rows.append(t)
        t = parents[t]
    return rows[::-1]


class Case:
    """A random pool (every slot filled), a batch over it and its q/k/v; the new rows' K/V are
    in the pool already, as every backend leaves them."""

    def __init__(self, seqs: list[tuple[int, int, bool]], heads: tuple[int, int, int],
                 dtype: torch.dtype, seed: int, page_size: int = 16) -> None:
        rng = random.Random(seed)
        torch.manual_seed(seed)
        num_heads, num_kv_heads, head_dim = heads
        num_pages = sum(-(-ctx // page_size) for _, ctx, _ in seqs) + 8
        self.pool = KVPool(config(*heads), KVLayout(num_pages, page_size, 0), dtype)
        self.pool.k[0].normal_()
        self.pool.v[0].normal_()
        plain = make_batch(self.pool, [n for n, _, _ in seqs], [c for _, c, _ in seqs], rng)
        self.parents = {i: random_parents(n, rng) for i, (n, _, tree) in enumerate(seqs) if tree}
        masks = {i: tree_mask_from_parents(p) for i, p in self.parents.items()}
        self.plain, self.batch = plain, dataclasses.replace(plain, tree_masks=masks)
        num_rows = sum(n for n, _, _ in seqs)
        self.q = torch.randn(num_rows, num_heads, head_dim).to(dtype)
        self.k = torch.randn(num_rows, num_kv_heads, head_dim).to(dtype)
        self.v = torch.randn(num_rows, num_kv_heads, head_dim).to(dtype)
        self.pool.flat_k(0)[plain.slot_mapping] = self.k
        self.pool.flat_v(0)[plain.slot_mapping] = self.v

    def run(self, backend: type, spec: AttentionSpec,
            batch: PagedBatch | None = None) -> torch.Tensor:
        attention = backend(self.pool, self.batch if batch is None else batch)
        return attention(spec, self.q, self.k, self.v)

    def reference(self, spec: AttentionSpec) -> torch.Tensor:
        """fp64 softmax per sequence over its whole context, each row's visible keys written
        out: the prefix, then its path for a tree row, every earlier row for a causal one."""
        flat_k, flat_v = self.pool.flat_k(0).double(), self.pool.flat_v(0).double()
        page_size, num_heads = self.pool.layout.page_size, self.q.shape[1]
        group = num_heads // flat_k.shape[1]
        outs, row = [], 0
        for i, (t_len, ctx) in enumerate(zip(self.batch.extend_lens, self.batch.context_lens,
                                             strict=True)):
            positions = torch.arange(ctx)
            slots = self.batch.page_tables[i][positions // page_size] * page_size \
                + positions % page_size
            k = flat_k[slots].repeat_interleave(group, dim=1)
            v = flat_v[slots].repeat_interleave(group, dim=1)
            prefix = ctx - t_len
            visible = torch.zeros(t_len, ctx, dtype=torch.bool)
            visible[:, :prefix] = True
            for t in range(t_len):
                seen = path(self.parents[i], t) if i in self.parents else range(t + 1)
                visible[t, [prefix + j for j in seen]] = True
            q = self.q[row:row + t_len].double()
            scores = torch.einsum("thd,jhd->htj", q, k) * spec.scale
            scores = scores.masked_fill(~visible, float("-inf"))
            if spec.sinks is not None:
                column = spec.sinks.double().view(-1, 1, 1).expand(num_heads, t_len, 1)
                probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
            else:
                probs = torch.softmax(scores, dim=-1)
            outs.append(torch.einsum("htj,jhd->thd", probs, v))
            row += t_len
        return torch.cat(outs)


def layer_spec(head_dim: int, sinks: bool, num_heads: int) -> AttentionSpec:
    if not sinks:
        return AttentionSpec.plain(0, head_dim)
    return AttentionSpec(0, 0.7 * head_dim**-0.5, sinks=torch.randn(num_heads))


@pytest.mark.parametrize(("dtype", "heads", "sinks"), CASES)
@pytest.mark.parametrize("name", BACKENDS)
def test_backend_matches_dense_reference(name: str, dtype: torch.dtype,
                                         heads: tuple[int, int, int], sinks: bool,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    backend = backend_class(name, monkeypatch)
    seqs = SEQS
    if name == "triton":
        if sinks:
            pytest.skip("the Triton kernels write no sinks (their backend refuses the layer)")
        seqs, heads = TRITON_SEQS, (heads[0], heads[1], 16)
    case = Case(seqs, heads, dtype, seed=len(name) + heads[2])
    spec = layer_spec(heads[2], sinks, heads[0])
    got = case.run(backend, spec)
    assert got.dtype == dtype and torch.isfinite(got).all()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), case.reference(spec).to(dtype).double(), atol=tol,
                               rtol=tol, msg=f"{name} {dtype} {heads}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(9, 3, 64), (8, 2, 32)])
@pytest.mark.parametrize("build", CPU_BUILDS)
def test_chain_mask_is_causal_bit_for_bit(build: str, dtype: torch.dtype,
                                          heads: tuple[int, int, int],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every multi-row sequence given the chain mask equals the batch without masks, exactly:
    the kernel takes every sequence here (at most 63 rows), with and without masks."""
    backend = backend_class("cpu" if build == "native" else f"cpu:{build}", monkeypatch)
    monkeypatch.setattr(CpuPagedAttention, "max_kernel_rows", 63)
    case = Case([(n, c, False) for n, c, _ in SEQS], heads, dtype, seed=3)
    chains = {i: chain_mask(n) for i, n in enumerate(case.plain.extend_lens)}
    chained = dataclasses.replace(case.plain, tree_masks=chains)
    spec = layer_spec(heads[2], True, heads[0])
    assert torch.equal(case.run(backend, spec, chained), case.run(backend, spec, case.plain))


@pytest.mark.parametrize("name", ["torch_sdpa", "cpu", "cpu:x86-64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_row_attends_as_its_path_decoded(name: str, dtype: torch.dtype,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With pages of one slot, a page table can lay out any rows in any order: node t's row in
    the tree step equals a decode whose context is the prefix, then t's ancestors' rows and
    its own (what a sequential decode of that path would have cached)."""
    backend = backend_class(name, monkeypatch)
    prefix, rows = 150, 24
    case = Case([(rows, prefix + rows, True)], (9, 3, 64), dtype, seed=5, page_size=1)
    spec = layer_spec(64, True, 9)
    tree_out = case.run(backend, spec)
    table = case.batch.page_tables[0]
    for t, parent in enumerate(case.parents[0]):
        seen = path(case.parents[0], t)
        decode = PagedBatch([1], [prefix + len(seen)], case.batch.slot_mapping[t:t + 1],
                            [torch.cat([table[:prefix], table[prefix + torch.tensor(seen)]])])
        attention = backend(case.pool, decode)
        one = attention(spec, case.q[t:t + 1], case.k[t:t + 1], case.v[t:t + 1])
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(one.float(), tree_out[t:t + 1].float(), atol=tol, rtol=tol,
                                   msg=f"node {t} (parent {parent}, path {seen})")
