"""Preallocated paged KV memory: one K and one V tensor per layer.

Layers come in up to two groups with separate page spaces: full-attention layers (every model has
them, or all its layers are in this group) and, for a model with sliding-window layers whose
memory is managed (`KVLayout.num_swa_pages > 0`), the sliding layers. A sliding layer needs only
the last window of a sequence's KV, so its pages are given back as the window moves and its pool
is smaller; page id i of one group and page id i of the other are different memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig
from engine.errors import InvalidRequest

# Sliding-layer pages per full-layer page when the caller does not say: enough for the windows
# of the running requests and of the cached branch heads, far less than full length.
DEFAULT_SWA_RATIO = 0.25


@dataclass(frozen=True)
class KVLayout:
    """What the pool sizing found: returned, never written back into a config.

    `swa_layers`: the layers whose pages are the sliding group's (empty: one group, every layer
    in `num_pages` pages). `bytes_per_page`: one full-group page over the full group's layers
    (every layer when there is one group)."""

    num_pages: int
    page_size: int
    bytes_per_page: int
    num_swa_pages: int = 0
    swa_layers: frozenset[int] = frozenset()
    swa_bytes_per_page: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens the full group holds: the longest context the pool can serve."""
        return self.num_pages * self.page_size

    @property
    def has_swa(self) -> bool:
        return bool(self.swa_layers)

    def pages_of(self, layer_idx: int) -> int:
        return self.num_swa_pages if layer_idx in self.swa_layers else self.num_pages


def _layer_page_bytes(config: ModelConfig, page_size: int, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.kv_size * page_size * itemsize


def plan_kv_layout(config: ModelConfig, kv_memory_bytes: int, page_size: int,
                   dtype: torch.dtype, swa_ratio: float | None = None,
                   chunk_tokens: int = 0) -> KVLayout:
    """How many pages fit in `kv_memory_bytes` for K and V of every layer. With `swa_ratio`
    (a model with sliding layers), the sliding layers get their own group of
    `swa_ratio` pages per full-group page, and never fewer than one request needs: a window
    plus a step's `chunk_tokens` (its pages are taken before the step and the window's tail
    given back after it)."""
    if page_size < 1:
        raise InvalidRequest(f"page_size must be >= 1, got {page_size}")
    layer_bytes = _layer_page_bytes(config, page_size, dtype)
    sliding = frozenset(i for i in range(config.num_layers) if config.is_sliding(i))
    if swa_ratio is None or not sliding or config.sliding_window is None:
        bytes_per_page = layer_bytes * config.num_layers
        num_pages = kv_memory_bytes // bytes_per_page
        _check_pages(int(num_pages), bytes_per_page, kv_memory_bytes)
        return KVLayout(int(num_pages), page_size, bytes_per_page)
    if not 0 < swa_ratio <= 1:
        raise InvalidRequest(f"the sliding-window page ratio must be in (0, 1], got {swa_ratio}")
    full_bytes = layer_bytes * (config.num_layers - len(sliding))
    swa_bytes = layer_bytes * len(sliding)
    num_pages = int(kv_memory_bytes // (full_bytes + swa_ratio * swa_bytes))
    # At least a window plus a chunk for one request, whatever the ratio says.
    window_pages = -(-config.sliding_window // page_size) + -(-chunk_tokens // page_size) + 2
    num_swa_pages = max(int(num_pages * swa_ratio), window_pages)
    if full_bytes:  # what the sliding group leaves goes to the full layers
        num_pages = int((kv_memory_bytes - num_swa_pages * swa_bytes) // full_bytes)
    # (Every layer sliding: the full group holds no memory, only the page ids that name a
    # sequence's positions, `num_pages` of them.)
    _check_pages(num_pages, full_bytes + swa_bytes, kv_memory_bytes)
    if num_swa_pages * swa_bytes > kv_memory_bytes:
        raise InvalidRequest(f"--kv-memory {kv_memory_bytes} bytes cannot hold one sliding "
                             f"window ({num_swa_pages} pages of {swa_bytes} bytes)")
    return KVLayout(num_pages, page_size, full_bytes, num_swa_pages, sliding, swa_bytes)


def _check_pages(num_pages: int, bytes_per_page: int, kv_memory_bytes: int) -> None:
    if num_pages < 2:
        raise InvalidRequest(
            f"--kv-memory {kv_memory_bytes} bytes holds fewer than 2 pages of {bytes_per_page} "
            "bytes; give the KV pool more memory"
        )


class KVPool:
    """K/V tensors of shape (pages of the layer's group, page_size, num_kv_heads, head_dim) per
    layer.

    Which pages are in use is tracked by `engine.cache.page_pool.PagePool` (one per group); this
    class only holds the memory and moves token rows in and out of it by slot index (page_id *
    page_size + offset, in the layer's group).
    """

    def __init__(self, config: ModelConfig, layout: KVLayout, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.layout = layout
        tail = (layout.page_size, config.num_kv_heads, config.head_dim)
        self.k = [torch.zeros((layout.pages_of(i), *tail), dtype=dtype, device=device)
                  for i in range(config.num_layers)]
        self.v = [torch.zeros((layout.pages_of(i), *tail), dtype=dtype, device=device)
                  for i in range(config.num_layers)]

    def flat_k(self, layer_idx: int) -> torch.Tensor:
        """(pages * page_size, num_kv_heads, head_dim) view of one layer's keys."""
        return self.k[layer_idx].view(-1, *self.k[layer_idx].shape[2:])

    def flat_v(self, layer_idx: int) -> torch.Tensor:
        return self.v[layer_idx].view(-1, *self.v[layer_idx].shape[2:])
