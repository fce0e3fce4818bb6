"""The interface every paged attention backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.attention.spec import AttentionSpec
from engine.kv_pool import KVPool


@dataclass(frozen=True)
class PagedBatch:
    """Where each sequence of a flattened batch reads and writes its KV.

    Rows of the batch are grouped by sequence, in order. For sequence i:
      [0, context_lens[i] - extend_lens[i])   KV already in its pages (cached or computed earlier)
      [context_lens[i] - extend_lens[i], context_lens[i])   the rows of this step, written now
    `slot_mapping` (N,) int64: pool slot of every row of the batch.
    `page_tables[i]`: int64 page ids covering at least context_lens[i] tokens.
    """

    extend_lens: list[int]
    context_lens: list[int]
    slot_mapping: torch.Tensor
    page_tables: list[torch.Tensor]


class PagedAttentionBackend(Protocol):
    name: str

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
