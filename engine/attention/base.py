"""The interface every paged attention backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.attention.spec import AttentionSpec
from engine.attention.tree import check_tree_masks
from engine.kv_pool import KVPool


@dataclass(frozen=True)
class PagedBatch:
    """Where each sequence of a flattened batch reads and writes its KV.

    Rows of the batch are grouped by sequence, in order. For sequence i:
      [0, context_lens[i] - extend_lens[i])   KV already in its pages (cached or computed earlier)
      [context_lens[i] - extend_lens[i], context_lens[i])   the rows of this step, written now
    `slot_mapping` (N,) int64: pool slot of every row of the batch.
    `page_tables[i]`: int64 page ids covering at least context_lens[i] tokens.
    `tree_masks` (tree verification, engine.attention.tree): {i: int64 CPU (extend_lens[i],)}
    for the sequences whose rows form a draft tree, extend_lens[i] <= 63. Row t of sequence i
    sees every position < context_lens[i] - extend_lens[i] (the prefix) and, among this step's
    rows, row j iff bit j of tree_masks[i][t] is set; bit t must be set (a node sees itself)
    and no bit above it (ancestors come first in row order). mask[t] = 2^(t + 1) - 1 is a
    causal chain: a sequence without a mask (or None for all) attends causally. Checked when
    the batch is built (ValueError); backends that cannot honour masks raise, never ignore
    them, and no backend takes them on a layer with a sliding window.
    """

    extend_lens: list[int]
    context_lens: list[int]
    slot_mapping: torch.Tensor
    page_tables: list[torch.Tensor]
    tree_masks: dict[int, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.tree_masks:
            check_tree_masks(self.tree_masks, self.extend_lens)


class PagedAttentionBackend(Protocol):
    name: str
    # Whether batches with `tree_masks` run (else they raise at construction): the engine
    # checks it before it drafts trees.
    supports_tree_masks: bool

    def __init__(self, pool: KVPool, batch: PagedBatch) -> None: ...

    @classmethod
    def unsupported(cls, spec: AttentionSpec) -> list[str]:
        """What of `spec` this backend cannot compute ("window", "sinks", "softcap", or a
        sentence); empty when it can run the layer."""
        ...

    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        """Store k/v of the batch rows into layer `spec.layer_idx` of the pool, then attend.
        Shapes as in `engine.models.base.AttentionFn`."""
        ...
