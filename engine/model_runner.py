"""Turns scheduled items into one flattened forward over the paged KV pool."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.attention.base import PagedAttentionBackend, PagedBatch
from engine.kv_pool import KVPool
from engine.models.llama import LlamaModel
from engine.scheduler.scheduler import ScheduledItem


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: KVPool,
                 backend: type[PagedAttentionBackend]) -> None:
        self.model = model
        self.pool = pool
        self.backend = backend
        self.page_size = pool.layout.page_size

    def build_batch(self, items: Sequence[ScheduledItem]) -> tuple[torch.Tensor, torch.Tensor,
                                                                     PagedBatch]:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        page_tables = []
        for item in items:
            req = item.request
            end = item.start + item.num_tokens
            input_ids.extend(req.all_ids[item.start : end])
            positions.extend(range(item.start, end))
            pages = req.page_ids
            slots.extend(pages[p // self.page_size] * self.page_size + p % self.page_size
                         for p in range(item.start, end))
            page_tables.append(torch.tensor(pages[: -(-end // self.page_size)], dtype=torch.long))
        batch = PagedBatch(
            extend_lens=[item.num_tokens for item in items],
            context_lens=[item.start + item.num_tokens for item in items],
            slot_mapping=torch.tensor(slots, dtype=torch.long),
            page_tables=page_tables,
        )
        return (torch.tensor(input_ids, dtype=torch.long), torch.tensor(positions,
                                                                         dtype=torch.long), batch)

    def run(self, items: Sequence[ScheduledItem]) -> torch.Tensor:
        """Forward every scheduled token; returns fp32 logits (num_sampling_items, vocab) for the
        items whose last row completes their sequence, in item order."""
        input_ids, positions, batch = self.build_batch(items)
        hidden = self.model.forward(input_ids, positions, self.backend(self.pool, batch))
        rows = []
        offset = 0
        for item in items:
            offset += item.num_tokens
            if item.needs_sample:
                rows.append(offset - 1)
        if not rows:
            return hidden.new_empty((0, self.model.config.vocab_size), dtype=torch.float32)
        return self.model.logits(hidden[torch.tensor(rows)])
