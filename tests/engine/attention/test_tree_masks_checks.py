"""Tree attention masks: the helpers that build them, the checks a `PagedBatch` runs on them,
and the refusals (a layer with a sliding window, the static decode path, bad kernel
arguments). What the backends compute under them is in test_tree_masks.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from engine.attention.base import PagedBatch
from engine.attention.cpu_invariant import InvariantCpuAttention
from engine.attention.cpu_paged import CpuPagedAttention, kernel, paged_attention
from engine.attention.registry import get_backend
from engine.attention.spec import AttentionSpec
from engine.attention.tree import (
    MAX_TREE_ROWS,
    chain_mask,
    row_masks,
    tree_mask_from_parents,
    tree_visible,
)
from engine.cuda_graph import StaticDecode
from tests.engine.attention.test_tree_masks import Case, path, random_parents

needs_kernel = pytest.mark.skipif(kernel() is None, reason="the CPU kernel is not built")


def test_chain_mask_is_every_earlier_row() -> None:
    assert chain_mask(1).tolist() == [1]
    assert chain_mask(4).tolist() == [0b1, 0b11, 0b111, 0b1111]
    assert chain_mask(63)[-1] == 2**63 - 1 and chain_mask(63).dtype == torch.int64
    assert torch.equal(tree_mask_from_parents([-1, *range(62)]), chain_mask(63))


def test_mask_from_parents_is_each_rows_path() -> None:
    assert tree_mask_from_parents([-1, 0, 0, 1]).tolist() == [0b0001, 0b0011, 0b0101, 0b1011]
    rng = random.Random(0)
    for n in (1, 2, 9, 40, 63):
        parents = random_parents(n, rng)
        mask = tree_mask_from_parents(parents)
        assert mask.dtype == torch.int64 and mask.shape == (n,)
        for t in range(n):
            assert int(mask[t]) == sum(1 << j for j in path(parents, t)), (parents, t)
    # A second root sees only itself (and the prefix).
    assert tree_mask_from_parents([-1, 0, -1, 2]).tolist() == [0b1, 0b11, 0b100, 0b1100]


@pytest.mark.parametrize("parents", [[], [0], [-1, 1], [-1, 0, 3, 1], [-1, -2], [-1, 0.5],
                                     [-1, True], [-1] * (MAX_TREE_ROWS + 1)])
def test_bad_parents_raise(parents: list[Any]) -> None:
    with pytest.raises(ValueError, match="tree"):
        tree_mask_from_parents(parents)


@pytest.mark.parametrize("n", [0, -1, 64, 2.0, True])
def test_bad_chain_lengths_raise(n: Any) -> None:
    with pytest.raises(ValueError, match="1 to 63 rows"):
        chain_mask(n)


def batch_of(extend_lens: list[int], tree_masks: dict[Any, Any]) -> PagedBatch:
    context_lens = [n + 5 for n in extend_lens]
    return PagedBatch(extend_lens, context_lens, torch.zeros(sum(extend_lens), dtype=torch.long),
                      [torch.arange(4) for _ in extend_lens], tree_masks)


@pytest.mark.parametrize(("extend_lens", "masks", "match"), [
    ([3], {1: chain_mask(3)}, "not a sequence of this batch"),
    ([3], {-1: chain_mask(3)}, "not a sequence of this batch"),
    ([3], {"0": chain_mask(3)}, "not a sequence of this batch"),
    ([64], {0: torch.ones(64, dtype=torch.int64)}, "1 to 63 rows"),
    ([0, 2], {0: torch.zeros(0, dtype=torch.int64)}, "1 to 63 rows"),
    ([3], {0: chain_mask(3).int()}, "int64 tensor, got torch.int32"),
    ([3], {0: [1, 3, 7]}, "int64 tensor, got list"),
    ([3], {0: chain_mask(4)}, r"shape \(3,\)"),
    ([3], {0: chain_mask(3).view(3, 1)}, r"shape \(3,\)"),
    ([3], {0: chain_mask(3).to("meta")}, "CPU tensor"),
    ([3], {0: torch.tensor([1, 1, 7])}, "row 1 does not see itself"),
    ([3], {0: torch.tensor([1, 3, 3])}, "row 2 does not see itself"),
    ([3], {0: torch.tensor([3, 3, 7])}, "row 0 sees a later row"),
    ([3], {0: torch.tensor([1, 3, 7 | 1 << 40])}, "row 2 sees a later row"),
    ([3], {0: torch.tensor([1, -1, 7])}, "row 1 sees a later row"),  # bit 63 set
])
def test_invalid_masks_raise_when_the_batch_is_built(extend_lens: list[int],
                                                     masks: dict[Any, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        batch_of(extend_lens, masks)


def test_valid_masks_and_their_row_entries() -> None:
    masks = {1: tree_mask_from_parents([-1, 0, 0]), 2: chain_mask(1)}
    batch = batch_of([2, 3, 1], masks)
    assert batch.tree_masks is masks and batch_of([2], {}).tree_masks == {}
    assert row_masks(masks, batch.extend_lens, range(3)).tolist() == [0, 0, 1, 3, 5, 1]
    assert row_masks(masks, batch.extend_lens, [2, 0]) is None  # one-row masks are causal
    assert row_masks(None, batch.extend_lens, range(3)) is None
    visible = tree_visible(masks[1], 8)  # a prefix of 5, then rows 0, 1 (child), 2 (child)
    assert visible[:, :5].all()
    assert visible[:, 5:].tolist() == [[True, False, False], [True, True, False],
                                       [True, False, True]]


@pytest.mark.parametrize("name", ["torch", "torch_sdpa", "cpu", "cpu_invariant"])
def test_tree_on_a_sliding_layer_is_refused(name: str) -> None:
    """A node's window would count along its path, not in row order: not written, refused."""
    if name.startswith("cpu") and kernel() is None:
        pytest.skip("the CPU kernel is not built")
    backend = InvariantCpuAttention if name == "cpu_invariant" else get_backend(name)
    case = Case([(5, 40, True), (1, 20, False)], (4, 2, 32), torch.float32, seed=1)
    with pytest.raises(ValueError, match="sliding window"):
        case.run(backend, AttentionSpec(0, 0.2, window=16))
    # Without masks, or with only one-row ones, the same layer runs.
    case.run(backend, AttentionSpec(0, 0.2, window=16), case.plain)
    one_row = dataclasses.replace(case.plain, tree_masks={1: chain_mask(1)})
    case.run(backend, AttentionSpec(0, 0.2, window=16), one_row)


def test_backends_say_whether_they_take_tree_masks() -> None:
    names = ["torch", "torch_sdpa", "cpu"]
    if importlib.util.find_spec("triton") is not None:
        names.append("triton")
    for name in names:
        assert get_backend(name).supports_tree_masks, name
    assert InvariantCpuAttention.supports_tree_masks


@needs_kernel
def test_cpu_invariant_keeps_trees_whole() -> None:
    """The tree's rows are not cut into pieces of 16 (the pieces would see each other as a
    prefix): they get the bits the "cpu" backend gives them; the cut causal extend matches."""
    case = Case([(40, 300, True), (37, 500, False), (1, 90, False)], (9, 3, 64),
                torch.float32, seed=9)
    spec = AttentionSpec.plain(0, 64)
    invariant, cpu = case.run(InvariantCpuAttention, spec), case.run(CpuPagedAttention, spec)
    assert torch.equal(invariant[:40], cpu[:40])
    torch.testing.assert_close(invariant, cpu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(invariant.double(), case.reference(spec), atol=1e-4, rtol=1e-4)


def test_static_decode_refuses_tree_batches() -> None:
    static = SimpleNamespace(max_batch_size=8, max_context_len=64)
    plain = batch_of([1, 1], {})
    assert StaticDecode.accepts(static, plain)  # type: ignore[arg-type]
    assert not StaticDecode.accepts(static, batch_of([1, 1], {0: chain_mask(1)}))  # type: ignore[arg-type]


@needs_kernel
def test_kernel_mask_argument_is_checked() -> None:
    case = Case([(5, 40, True)], (4, 2, 32), torch.float32, seed=2)
    flat_k, flat_v = case.pool.flat_k(0), case.pool.flat_v(0)
    table = case.batch.page_tables[0]
    index = (table[: -(-40 // 16)].contiguous(), torch.tensor([0]), torch.tensor([40]),
             torch.tensor([0, 5]))
    masks = case.batch.tree_masks[0]  # type: ignore[index]
    got = paged_attention(case.q, flat_k, flat_v, *index, 16, 64, masks=masks)
    torch.testing.assert_close(got.double(), case.reference(AttentionSpec.plain(0, 32)),
                               atol=1e-5, rtol=1e-5)
    for bad, error in ((masks.int(), TypeError), (masks[:4], ValueError),
                       (torch.stack([masks, masks], 1)[:, 0], ValueError)):
        with pytest.raises(error, match="paged_attention masks"):
            paged_attention(case.q, flat_k, flat_v, *index, 16, 64, masks=bad)
    with pytest.raises(ValueError, match="tree masks are not supported with a window"):
        paged_attention(case.q, flat_k, flat_v, *index, 16, 64, masks=masks, window=8)
