"""The engine's prefix cache, and the host KV tier behind it when one is configured."""

from __future__ import annotations

from collections.abc import Callable

from engine.cache.base import PrefixCache
from engine.cache.host_tier import HostTier
from engine.cache.no_cache import NoPrefixCache
from engine.cache.page_pool import PagePool
from engine.cache.radix_cache import RadixCache
from engine.kv_pool import KVPool


def build_cache(page_pool: PagePool, kv_pool: KVPool, *, enable_prefix_cache: bool,
                host_kv_memory_bytes: int, clock: Callable[[], float]
                ) -> tuple[PrefixCache, HostTier | None]:
    """A radix cache (a null one when disabled) and, with `host_kv_memory_bytes` > 0 and the
    prefix cache on, a host tier of that many bytes' worth of pages that the radix cache's
    evictions spill into."""
    layout = kv_pool.layout
    if not enable_prefix_cache:
        return NoPrefixCache(page_pool, layout.page_size), None
    num_host_pages = host_kv_memory_bytes // layout.bytes_per_page
    tier = HostTier(kv_pool, num_host_pages) if num_host_pages > 0 else None
    cache = RadixCache(page_pool, layout.page_size, clock=clock,
                       on_evict=tier.save_node if tier is not None else None)
    return cache, tier
