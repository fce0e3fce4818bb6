"""Rank 0's model runner over a tensor-parallel group, and the messages it broadcasts.

Rank 0 keeps the one scheduler and radix cache: it builds each step's inputs from the scheduled
items (`ModelRunner.build_step`: ids, positions, slots, page tables, tree masks, the sliding
group's batch), broadcasts them, and every rank runs the forward on its shard over its own KV
pool, whose pages are numbered alike on every rank (same layout, same page ids). The o and down
projections' all-reduces inside the forward keep the ranks in step; rank 0 alone computes
logits. KV moves outside a forward (accepted draft-tree rows) are broadcast the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from engine.attention.base import PagedAttentionBackend, PagedBatch
from engine.kv_pool import KVLayout, KVPool
from engine.model_runner import ModelRunner, StepInputs
from engine.models.base import Model

if TYPE_CHECKING:
    from engine.tp.launch import TensorParallel


@dataclass(frozen=True)
class RankSetup:
    """What a follower builds its pool and runner from, after its shard: rank 0's layout (so
    page ids mean the same memory on every rank) and attention backend."""

    layout: KVLayout
    kv_dtype: torch.dtype
    backend: type[PagedAttentionBackend]


@dataclass(frozen=True)
class CopyRows:
    """`ModelRunner.copy_rows` on every rank."""

    src_slots: list[int]
    dst_slots: list[int]


@dataclass(frozen=True)
class Stop:
    """The follower exits (rank 0 is closing the group)."""


def step_on(step: StepInputs, device: torch.device, keep_layers: bool = True) -> StepInputs:
    """`step` with its index tensors on `device` (page tables and tree masks stay on the host,
    as the backends take them); without `keep_layers`, capturing nothing."""
    def batch_on(batch: PagedBatch) -> PagedBatch:
        return replace(batch, slot_mapping=batch.slot_mapping.to(device))

    return replace(step, input_ids=step.input_ids.to(device),
                   positions=step.positions.to(device), batch=batch_on(step.batch),
                   sliding=None if step.sliding is None else batch_on(step.sliding),
                   layers=step.layers if keep_layers else ())


class TensorParallelRunner(ModelRunner):
    """A `ModelRunner` whose forwards and KV moves run on every rank of `tp`. CUDA graphs are
    not used (a graph would hold the collectives of one rank only)."""

    def __init__(self, model: Model, pool: KVPool, backend: type[PagedAttentionBackend],
                 tp: TensorParallel) -> None:
        super().__init__(model, pool, backend, None)
        self.tp = tp

    def forward_step(self, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self.tp.collective():
            # Followers capture nothing: the residual stream is the same on every rank.
            self.tp.group.broadcast_object(step_on(step, torch.device("cpu"), False))
            return super().forward_step(step)

    def copy_rows(self, src_slots: Sequence[int], dst_slots: Sequence[int]) -> None:
        with self.tp.collective():
            self.tp.group.broadcast_object(CopyRows(list(src_slots), list(dst_slots)))
            super().copy_rows(src_slots, dst_slots)
