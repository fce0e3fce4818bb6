"""Paged attention with the Triton kernels: store K/V, then decode or extend attention.

On CUDA the kernels compile. On CPU they run only under Triton's interpreter, which must be
switched on with `TRITON_INTERPRET=1` in the environment before `triton` is first imported
(e.g. `TRITON_INTERPRET=1 radixgate ... --attention-backend triton`); it is slow and meant for
tests. Rows with extend_len == 1 go to the split-K decode kernel, the others to the extend kernel,
which also takes the tree masks of a draft tree's rows (`PagedBatch.tree_masks`).
"""

from __future__ import annotations

import os

import torch

from engine.attention.base import PagedBatch
from engine.attention.spec import AttentionSpec
from engine.attention.tree import row_masks
from engine.attention.triton_decode import decode_attention
from engine.attention.triton_kernels import extend_attention, pad_page_tables, store_kv
from engine.errors import InvalidRequest
from engine.kv_pool import KVPool


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class TritonPagedAttention:
    name = "triton"
    supports_tree_masks = True

    def __init__(self, pool: KVPool, batch: PagedBatch) -> None:
        self.pool = pool
        self.batch = batch
        device = pool.k[0].device
        if device.type == "cpu" and not interpreter_enabled():
            raise InvalidRequest(
                "the triton attention backend needs CUDA, or TRITON_INTERPRET=1 set before "
                "triton is imported to run its kernels on CPU (slow)")
        self.device = device
        self.slot_mapping = batch.slot_mapping.to(device)
        starts: list[int] = []
        offset = 0
        for extend_len in batch.extend_lens:
            starts.append(offset)
            offset += extend_len
        self.num_rows = offset
        decode_idx = [i for i, n in enumerate(batch.extend_lens) if n == 1]
        extend_idx = [i for i, n in enumerate(batch.extend_lens) if n > 1]

        def int32(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32).to(device)

        # Per-step metadata, built once and reused by every layer.
        self.decode = None
        if decode_idx:
            ctx = [batch.context_lens[i] for i in decode_idx]
            self.decode = (int32([starts[i] for i in decode_idx]), int32(ctx),
                           pad_page_tables([batch.page_tables[i] for i in decode_idx], device),
                           max(ctx))
        # One entry per row of the batch (0: causal); a one-row mask is a decode's.
        masks = row_masks(batch.tree_masks, batch.extend_lens, range(len(batch.extend_lens)))
        self.tree_masks = None if masks is None else masks.to(device)
        self.extend = None
        if extend_idx:
            ext = [batch.extend_lens[i] for i in extend_idx]
            self.extend = (int32([starts[i] for i in extend_idx]), int32(ext),
                           int32([batch.context_lens[i] for i in extend_idx]),
                           pad_page_tables([batch.page_tables[i] for i in extend_idx], device),
                           max(ext))

    @classmethod
    def unsupported(cls, spec: AttentionSpec) -> list[str]:
        """The kernels take a per-layer scale; windows, sinks and softcap are not written."""
        return sorted(spec.features)

    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.pool.k[spec.layer_idx], self.pool.v[spec.layer_idx]
        store_kv(k, v, k_cache, v_cache, self.slot_mapping)
        if q.stride(2) != 1:
            q = q.contiguous()
        out = torch.empty_like(q)
        if self.decode is not None:
            q_rows, ctx, table, max_ctx = self.decode
            decode_attention(q, k_cache, v_cache, out, q_rows, ctx, table, max_ctx,
                             sm_scale=spec.scale)
        if self.extend is not None:
            q_starts, ext, ctx, table, max_ext = self.extend
            extend_attention(q, k_cache, v_cache, out, q_starts, ext, ctx, table, max_ext,
                             sm_scale=spec.scale, tree_masks=self.tree_masks)
        return out
