"""Preallocated paged KV memory: one K and one V tensor per layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig
from engine.errors import InvalidRequest


@dataclass(frozen=True)
class KVLayout:
    """What the pool sizing found: returned, never written back into a config."""

    num_pages: int
    page_size: int
    bytes_per_page: int

    @property
    def num_tokens(self) -> int:
        return self.num_pages * self.page_size


def plan_kv_layout(config: ModelConfig, kv_memory_bytes: int, page_size: int,
                   dtype: torch.dtype) -> KVLayout:
    """How many pages fit in `kv_memory_bytes` for K and V of every layer."""
    if page_size < 1:
        raise InvalidRequest(f"page_size must be >= 1, got {page_size}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    bytes_per_page = config.num_kv_values_per_token * page_size * itemsize
    num_pages = kv_memory_bytes // bytes_per_page
    if num_pages < 2:
        raise InvalidRequest(
            f"--kv-memory {kv_memory_bytes} bytes holds fewer than 2 pages of {bytes_per_page} "
            "bytes; give the KV pool more memory"
        )
    return KVLayout(num_pages=int(num_pages), page_size=page_size, bytes_per_page=bytes_per_page)


class KVPool:
    """K/V tensors of shape (num_pages, page_size, num_kv_heads, head_dim) per layer.

    Which pages are in use is tracked by `engine.cache.page_pool.PagePool`; this class only holds
    the memory and moves token rows in and out of it by slot index (page_id * page_size + offset).
    """

    def __init__(self, config: ModelConfig, layout: KVLayout, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.layout = layout
        shape = (layout.num_pages, layout.page_size, config.num_kv_heads, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]

    def flat_k(self, layer_idx: int) -> torch.Tensor:
        """(num_pages * page_size, num_kv_heads, head_dim) view of one layer's keys."""
        return self.k[layer_idx].view(-1, *self.k[layer_idx].shape[2:])

    def flat_v(self, layer_idx: int) -> torch.Tensor:
        return self.v[layer_idx].view(-1, *self.v[layer_idx].shape[2:])
