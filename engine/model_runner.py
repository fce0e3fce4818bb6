"""Turns scheduled items into one flattened forward over the paged KV pool.

Index tensors (ids, positions, slots) are built on the model's device; page tables stay on the
host, where each backend pads them into one device tensor per step. Decode batches go through
`engine.cuda_graph.StaticDecode` when one is given (CUDA graphs on CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine.attention.base import PagedAttentionBackend, PagedBatch
from engine.kv_pool import KVPool
from engine.models.base import Model
from engine.scheduler.scheduler import ScheduledItem

if TYPE_CHECKING:
    from engine.cuda_graph import StaticDecode


class ModelRunner:
    def __init__(self, model: Model, pool: KVPool,
                 backend: type[PagedAttentionBackend],
                 static_decode: StaticDecode | None = None) -> None:
        self.model = model
        self.pool = pool
        self.backend = backend
        self.page_size = pool.layout.page_size
        self.device = model.device
        self.static_decode = static_decode  # decode batches it accepts bypass `backend`

    def build_batch(self, items: Sequence[ScheduledItem]) -> tuple[torch.Tensor, torch.Tensor,
                                                                     PagedBatch]:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        page_tables = []
        for item in items:
            req = item.request
            end = item.start + item.num_tokens
            input_ids.extend(req.all_ids[item.start : end - item.num_draft])
            input_ids.extend(req.draft_ids[: item.num_draft])
            positions.extend(range(item.start, end))
            pages = req.page_ids
            slots.extend(pages[p // self.page_size] * self.page_size + p % self.page_size
                         for p in range(item.start, end))
            page_tables.append(torch.tensor(pages[: -(-end // self.page_size)], dtype=torch.long))
        batch = PagedBatch(
            extend_lens=[item.num_tokens for item in items],
            context_lens=[item.start + item.num_tokens for item in items],
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=self.device),
            page_tables=page_tables,
        )
        return (torch.tensor(input_ids, dtype=torch.long, device=self.device),
                torch.tensor(positions, dtype=torch.long, device=self.device), batch)

    def run(self, items: Sequence[ScheduledItem]) -> torch.Tensor:
        """Forward every scheduled token; returns fp32 CPU logits for the items whose rows complete
        their sequence, in item order: one row each, or 1 + num_draft rows for drafted items."""
        input_ids, positions, batch = self.build_batch(items)
        if self.static_decode is not None and self.static_decode.accepts(batch):
            hidden = self.static_decode.forward(input_ids, positions, batch)
        else:
            hidden = self.model.forward(input_ids, positions, self.backend(self.pool, batch))
        rows: list[int] = []
        offset = 0
        for item in items:
            offset += item.num_tokens
            if item.needs_sample:
                rows.extend(range(offset - 1 - item.num_draft, offset))
        if not rows:
            return torch.empty((0, self.model.config.vocab_size), dtype=torch.float32)
        # Sampling, grammar masks and draft acceptance run on the CPU for now, so the sampled
        # rows' fp32 logits come back to the host once per step (a no-op on the CPU).
        return self.model.logits(hidden[torch.tensor(rows, device=hidden.device)]).cpu()
