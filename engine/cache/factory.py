"""The engine's prefix cache and the KV tiers behind it: a host pool its evictions spill into,
and a directory that pinned branch heads are written to (so a restarted worker starts warm)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.cache.base import PrefixCache, SlidingWindow
from engine.cache.disk_tier import DiskTier
from engine.cache.host_tier import HostTier, KVTier
from engine.cache.no_cache import NoPrefixCache
from engine.cache.page_pool import PagePool
from engine.cache.radix_cache import RadixCache
from engine.cache.radix_node import RadixNode, path_page_ids, path_token_ids
from engine.kv_pool import KVPool


@dataclass(frozen=True)
class CacheTiers:
    host: HostTier | None = None
    disk: DiskTier | None = None

    @property
    def all(self) -> list[KVTier]:
        """Where a request's missing pages are looked for, nearest first."""
        return [t for t in (self.host, self.disk) if t is not None]

    def save_pinned(self, cache: PrefixCache, turn_id: str) -> None:
        """Write a pinned turn's cached path to the disk tier (pages already there are not)."""
        if self.disk is None:
            return
        ref = cache.lookup_turn(turn_id)
        if ref is not None and isinstance(ref.node, RadixNode):
            self.disk.save_path(ref.namespace, path_token_ids(ref.node),
                                path_page_ids(ref.node))


def build_cache(page_pool: PagePool, kv_pool: KVPool, *, enable_prefix_cache: bool,
                host_kv_memory_bytes: int, kv_dir: str | None, kv_disk_bytes: int,
                fingerprint: str, clock: Callable[[], float], swa: SlidingWindow | None = None
                ) -> tuple[PrefixCache, CacheTiers]:
    """A radix cache (a null one when disabled) and, with the prefix cache on, a host tier of
    `host_kv_memory_bytes` (when > 0) and a disk tier of `kv_disk_bytes` under `kv_dir` (when
    given and > 0; `fingerprint` names the model's subdirectory). `swa`: the sliding-window
    layers' page group, which the radix cache then tracks too (no tiers with it)."""
    if swa is not None and (host_kv_memory_bytes or kv_disk_bytes):
        raise ValueError("the host and disk tiers move whole pages: not with sliding-window "
                         "memory")
    layout = kv_pool.layout
    if not enable_prefix_cache:
        return NoPrefixCache(page_pool, layout.page_size), CacheTiers()
    num_host_pages = host_kv_memory_bytes // layout.bytes_per_page if host_kv_memory_bytes else 0
    host = HostTier(kv_pool, num_host_pages) if num_host_pages > 0 else None
    disk = (DiskTier(kv_pool, Path(kv_dir), fingerprint, kv_disk_bytes)
            if kv_dir and kv_disk_bytes > 0 else None)
    cache = RadixCache(page_pool, layout.page_size, clock=clock,
                       on_evict=host.save_node if host is not None else None, swa=swa)
    return cache, CacheTiers(host, disk)
