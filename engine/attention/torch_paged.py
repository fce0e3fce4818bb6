"""Paged attention in plain torch: gather each sequence's slots, then SDPA. The CPU backend and
the reference the Triton kernels are tested against."""

from __future__ import annotations

import torch

from engine.attention.base import PagedBatch
from engine.attention.dense import causal_attention
from engine.kv_pool import KVPool


class TorchPagedAttention:
    name = "torch"

    def __init__(self, pool: KVPool, batch: PagedBatch) -> None:
        self.pool = pool
        self.batch = batch
        page_size = pool.layout.page_size
        offsets = torch.arange(page_size)
        # Slot indices of every context token, computed once per step and reused by all layers.
        self.gather_slots = [
            (table.unsqueeze(1) * page_size + offsets).flatten()[:context_len]
            for table, context_len in zip(batch.page_tables, batch.context_lens, strict=True)
        ]

    def __call__(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        flat_k, flat_v = self.pool.flat_k(layer_idx), self.pool.flat_v(layer_idx)
        flat_k[self.batch.slot_mapping] = k
        flat_v[self.batch.slot_mapping] = v
        outs = []
        start = 0
        for slots, extend_len in zip(self.gather_slots, self.batch.extend_lens, strict=True):
            end = start + extend_len
            outs.append(causal_attention(q[start:end], flat_k[slots], flat_v[slots]))
            start = end
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
