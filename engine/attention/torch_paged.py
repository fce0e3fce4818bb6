"""Paged attention in torch: gather each sequence's slots, then attend. The CPU backend ("torch":
fused flash extends) and its plain reference ("torch_sdpa": one masked SDPA per sequence), which
the Triton kernels are also tested against. Both run a sequence with a tree mask
(`PagedBatch.tree_masks`) through the fp32 reference math under its explicit mask."""

from __future__ import annotations

import torch

from engine.attention.base import PagedBatch
from engine.attention.cpu_flash import FLASH_FEATURES, extend_attention
from engine.attention.dense import causal_attention, masked_attention
from engine.attention.spec import AttentionSpec, first_visible
from engine.attention.tree import check_tree_spec, tree_visible
from engine.kv_pool import KVPool


def _softmax(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim of (KVH, G, ..., S) scores; `sinks` (KVH * G,) join each
    row's denominator with no value (dropped after the softmax)."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    shape = (scores.shape[0], scores.shape[1]) + (1,) * (scores.dim() - 2)
    column = sinks.to(scores.dtype).view(shape).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     spec: AttentionSpec | None = None) -> torch.Tensor:
    """One query row that sees every key given (a window's caller passes only the window).
    q: (1, Hq, D); k, v: (S, Hkv, D) -> (1, Hq, D).

    The query heads of each KV group are folded into one (G, D) @ (D, S) product, so grouped
    heads never expand K/V; SDPA's CPU path is several times slower for a single query row.
    """
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    group = q.shape[1] // num_kv_heads
    qg = q.view(num_kv_heads, group, head_dim)
    scale = spec.scale if spec is not None else head_dim**-0.5
    scores = torch.bmm(qg, k.permute(1, 2, 0)).mul_(scale)
    sinks = spec.sinks.view(num_kv_heads, group) if spec is not None and spec.sinks is not None \
        else None
    probs = _softmax(scores, sinks)
    return torch.bmm(probs, v.transpose(0, 1)).view(1, -1, head_dim)


def gathered_decode_attention(q: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor,
                              slots: torch.Tensor, valid: torch.Tensor,
                              spec: AttentionSpec | None = None) -> torch.Tensor:
    """B single-row queries, each over its own context, read straight from the pool; grouped
    heads fold as in `decode_attention` (the reference). q: (B, Hq, D); flat_k, flat_v:
    (num_slots, Hkv, D), a layer of the pool; slots: (B, S) slot of each context position
    (any slot on padding); valid: (B, S). -> (B, Hq, D).

    Each KV head's keys and values are gathered once into (B, S, D) blocks that the two bmm
    calls read as they are (the key block transposed in place), so every KV byte is copied
    once (gathering (B, S, Hkv, D) and permuting it for the bmm copied it twice more, 2.3x
    slower at 40 rows of 700 tokens). The whole batch is a few ops per KV head, not per row."""
    num_seqs, s_len = slots.shape
    num_kv_heads, head_dim = flat_k.shape[1], flat_k.shape[2]
    group = q.shape[1] // num_kv_heads
    index = slots.flatten()
    qg = q.view(num_seqs, num_kv_heads, group, head_dim)
    padding = ~valid.view(num_seqs, 1, s_len)
    scale = spec.scale if spec is not None else head_dim**-0.5
    out = torch.empty(num_seqs, num_kv_heads, group, head_dim, dtype=q.dtype, device=q.device)
    for head in range(num_kv_heads):
        k = flat_k[:, head].index_select(0, index).view(num_seqs, s_len, head_dim)
        v = flat_v[:, head].index_select(0, index).view(num_seqs, s_len, head_dim)
        scores = torch.bmm(qg[:, head], k.transpose(1, 2)).mul_(scale)
        scores.masked_fill_(padding, float("-inf"))
        sinks = None
        if spec is not None and spec.sinks is not None:
            # (G,) of this KV head, laid out as _softmax's (KVH, G) leading dims: (B, G, S).
            sinks = spec.sinks.view(num_kv_heads, group)[head].view(1, group)
            sinks = sinks.expand(num_seqs, group).reshape(-1)
        probs = _softmax(scores, sinks)
        out[:, head] = torch.bmm(probs, v)
    return out.view(num_seqs, -1, head_dim)


class TorchPagedAttention:
    name = "torch"
    fused_extend = True
    supports_tree_masks = True
    # Decode rows of a step are attended together, straight from the pool, once there are
    # this many (padding to the longest context wastes little next to one op round per
    # sequence per layer; one row alone still saves the copies of `decode_attention`).
    min_batched_decodes = 1

    def __init__(self, pool: KVPool, batch: PagedBatch) -> None:
        self.pool = pool
        self.batch = batch
        page_size = pool.layout.page_size
        offsets = torch.arange(page_size)
        device = pool.k[0].device
        # Slot indices of every context token, computed once per step and reused by all layers.
        self.gather_slots = [
            (table.unsqueeze(1) * page_size + offsets).flatten()[:context_len].to(device)
            for table, context_len in zip(batch.page_tables, batch.context_lens, strict=True)
        ]
        self.row_starts = [0]
        for extend_len in batch.extend_lens:
            self.row_starts.append(self.row_starts[-1] + extend_len)
        # (T, context) visibility of each tree-masked sequence of more than one row (a one-row
        # mask is a decode's), built once for every layer.
        self.tree_visible = {
            i: tree_visible(mask, batch.context_lens[i]).to(device)
            for i, mask in (batch.tree_masks or {}).items() if batch.extend_lens[i] > 1}
        decodes = [i for i, n in enumerate(batch.extend_lens) if n == 1]
        self.decode_items: frozenset[int] = frozenset()
        if self.fused_extend and len(decodes) >= self.min_batched_decodes:
            self.decode_items = frozenset(decodes)
            max_len = max(batch.context_lens[i] for i in decodes)
            padded = torch.zeros(len(decodes), max_len, dtype=torch.long)
            self.decode_valid = torch.zeros(len(decodes), max_len, dtype=torch.bool)
            for row, i in enumerate(decodes):
                padded[row, : batch.context_lens[i]] = self.gather_slots[i]
                self.decode_valid[row, : batch.context_lens[i]] = True
            self.decode_slots = padded
            self.decode_rows = torch.tensor([self.row_starts[i] for i in decodes])

    @classmethod
    def unsupported(cls, spec: AttentionSpec) -> list[str]:
        """Nothing: features the fast paths lack (softcap) run the reference math."""
        return []

    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        if self.tree_visible:
            check_tree_spec(spec)
        flat_k, flat_v = self.pool.flat_k(spec.layer_idx), self.pool.flat_v(spec.layer_idx)
        # Attention runs in the pool's dtype (a mixed-precision model's pool is bf16 under fp32
        # rows); the output comes back in q's.
        out_dtype = q.dtype
        q, k, v = q.to(flat_k.dtype), k.to(flat_k.dtype), v.to(flat_k.dtype)
        flat_k[self.batch.slot_mapping] = k
        flat_v[self.batch.slot_mapping] = v
        reference = not spec.features <= FLASH_FEATURES  # softcap: the reference math only
        # A window's decodes go one by one over their window's slots: the batched gather reads
        # whole contexts, and a sliding group's pages before the window may be given back.
        batched = frozenset() if reference or spec.window is not None else self.decode_items
        outs = []
        for i, slots in enumerate(self.gather_slots):
            if i in batched:
                continue
            start, end = self.row_starts[i], self.row_starts[i + 1]
            # A sliding window's rows see no key before `lo`: those are never read.
            lo = first_visible(spec, self.batch.context_lens[i] - (end - start))
            if i in self.tree_visible:
                outs.append((i, masked_attention(q[start:end], flat_k[slots], flat_v[slots],
                                                 spec, self.tree_visible[i])))
                continue
            if reference:
                attend = causal_attention
            elif end - start == 1:
                attend = decode_attention
            else:
                # The fused extend calls a CPU-only aten kernel: on CUDA, masked SDPA instead.
                fused = self.fused_extend and q.device.type == "cpu"
                attend = extend_attention if fused else causal_attention
            outs.append((i, attend(q[start:end], flat_k[slots[lo:]], flat_v[slots[lo:]], spec)))
        if not batched:
            joined = outs[0][1] if len(outs) == 1 else torch.cat([o for _, o in outs], dim=0)
            return joined.to(out_dtype)
        out = torch.empty_like(q)
        out[self.decode_rows] = gathered_decode_attention(
            q[self.decode_rows], flat_k, flat_v, self.decode_slots, self.decode_valid, spec)
        for i, part in outs:
            out[self.row_starts[i] : self.row_starts[i + 1]] = part
        return out.to(out_dtype)


class TorchSdpaPagedAttention(TorchPagedAttention):
    """The plain reference: extends run one masked SDPA over the whole context."""

    name = "torch_sdpa"
    fused_extend = False
