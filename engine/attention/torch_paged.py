"""Paged attention in torch: gather each sequence's slots, then attend. The CPU backend ("torch":
fused flash extends) and its plain reference ("torch_sdpa": one masked SDPA per sequence), which
the Triton kernels are also tested against."""

from __future__ import annotations

import torch

from engine.attention.base import PagedBatch
from engine.attention.cpu_flash import extend_attention
from engine.attention.dense import causal_attention
from engine.kv_pool import KVPool


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query row that sees every key. q: (1, Hq, D); k, v: (S, Hkv, D) -> (1, Hq, D).

    The query heads of each KV group are folded into one (G, D) @ (D, S) product, so grouped
    heads never expand K/V; SDPA's CPU path is several times slower for a single query row.
    """
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    group = q.shape[1] // num_kv_heads
    qg = q.view(num_kv_heads, group, head_dim)
    scores = torch.bmm(qg, k.permute(1, 2, 0)).mul_(head_dim**-0.5)
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, v.transpose(0, 1)).view(1, -1, head_dim)


class TorchPagedAttention:
    name = "torch"
    fused_extend = True

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
            if extend_len == 1:
                attend = decode_attention
            else:
                attend = extend_attention if self.fused_extend else causal_attention
            outs.append(attend(q[start:end], flat_k[slots], flat_v[slots]))
            start = end
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


class TorchSdpaPagedAttention(TorchPagedAttention):
    """The plain reference: extends run one masked SDPA over the whole context."""

    name = "torch_sdpa"
    fused_extend = False
