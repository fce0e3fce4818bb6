"""Paged attention with flash-attn: `flash_attn_with_kvcache` + block table for decode rows,
`flash_attn_varlen_func` + block table for extend rows.

Importable only where flash_attn imports and CUDA is present (ImportError otherwise, which the
registry turns into a clear error). K/V of the new rows are stored with the Triton store kernel.
flash-attn 2 reads paged KV only when page_size is a multiple of 256 (checked at construction).
Not run in CI (no GPU): `benchmarks/gpu_check.sh` exercises it where the package imports.
"""

from __future__ import annotations

import torch

if not torch.cuda.is_available():
    raise ImportError("flash_attn backend needs a CUDA device")

from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: E402

from engine.attention.base import PagedBatch  # noqa: E402
from engine.attention.spec import AttentionSpec  # noqa: E402
from engine.attention.triton_kernels import pad_page_tables, store_kv  # noqa: E402
from engine.errors import InvalidRequest  # noqa: E402
from engine.kv_pool import KVPool  # noqa: E402

FLASH_PAGE_MULTIPLE = 256


class FlashAttnBackend:
    name = "flash_attn"
    # flash-attn's paged calls take causal or no mask, not a per-row tree mask.
    supports_tree_masks = False

    def __init__(self, pool: KVPool, batch: PagedBatch) -> None:
        if batch.tree_masks:
            raise InvalidRequest("attention backend 'flash_attn' cannot run tree attention "
                                 "masks (tree verification); use 'triton' or verify drafts "
                                 "as a chain")
        page_size = pool.layout.page_size
        if page_size % FLASH_PAGE_MULTIPLE != 0:
            raise InvalidRequest(
                f"flash_attn paged KV needs page_size % {FLASH_PAGE_MULTIPLE} == 0, got "
                f"{page_size}; use --attention-backend triton")
        device = pool.k[0].device
        self.pool = pool
        self.slot_mapping = batch.slot_mapping.to(device)
        starts, offset = [], 0
        for n in batch.extend_lens:
            starts.append(offset)
            offset += n
        dec = [i for i, n in enumerate(batch.extend_lens) if n == 1]
        ext = [i for i, n in enumerate(batch.extend_lens) if n > 1]

        def int32(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32).to(device)

        def cumsum(values: list[int]) -> torch.Tensor:
            return int32([0, *torch.tensor(values).cumsum(0).tolist()])

        self.dec_rows = torch.tensor([starts[i] for i in dec], dtype=torch.long).to(device)
        self.dec_lens = int32([batch.context_lens[i] for i in dec])
        self.dec_table = pad_page_tables([batch.page_tables[i] for i in dec], device)
        ext_lens = [batch.extend_lens[i] for i in ext]
        ctx_lens = [batch.context_lens[i] for i in ext]
        self.ext_rows = torch.cat([torch.arange(starts[i], starts[i] + batch.extend_lens[i])
                                   for i in ext]).to(device) if ext else None
        self.ext_cu_q, self.ext_cu_k = cumsum(ext_lens), cumsum(ctx_lens)
        self.ext_max_q, self.ext_max_k = max(ext_lens, default=0), max(ctx_lens, default=0)
        self.ext_table = pad_page_tables([batch.page_tables[i] for i in ext], device)

    @classmethod
    def unsupported(cls, spec: AttentionSpec) -> list[str]:
        """A per-layer scale is passed; windows, sinks and softcap are not wired (nor tested
        on a GPU here), so a model that needs them runs another backend."""
        return sorted(spec.features)

    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.pool.k[spec.layer_idx], self.pool.v[spec.layer_idx]
        store_kv(k, v, k_cache, v_cache, self.slot_mapping)
        out = torch.empty_like(q)
        if self.dec_rows.numel():
            q_dec = q[self.dec_rows].unsqueeze(1)  # (B, 1, Hq, D)
            out_dec = flash_attn_with_kvcache(q_dec, k_cache, v_cache,
                                              cache_seqlens=self.dec_lens,
                                              block_table=self.dec_table, causal=True,
                                              softmax_scale=spec.scale)
            out[self.dec_rows] = out_dec.squeeze(1)
        if self.ext_rows is not None:
            out[self.ext_rows] = flash_attn_varlen_func(
                q[self.ext_rows], k_cache, v_cache, self.ext_cu_q, self.ext_cu_k,
                self.ext_max_q, self.ext_max_k, softmax_scale=spec.scale, causal=True,
                block_table=self.ext_table)
        return out
