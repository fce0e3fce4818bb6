"""A second, bounded KV store for pages the radix cache evicts: loaded back on a hit instead
of recomputed.

    evict    the radix cache drops a leaf: each of its pages' K/V (every layer) is copied into
             a host page, keyed by the hash of the token path through that page's end
    restore  before a request is admitted, the pages after its cached prefix whose keys the
             tier holds are copied into fresh device pages and inserted into the radix cache,
             so the admission that follows matches them like any cached prefix

Keys chain page by page (`page_keys`): a page's key names its whole prefix, so a page is only
ever restored behind the same tokens it was computed behind. The tier is LRU over host pages;
on a GPU its memory is pinned (copies overlap nothing yet: they run on the current stream). On
CPU it is a second pool in RAM: with no device/host distinction its use is the same mechanism,
tested where it matters less.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import torch

from engine.cache.base import PrefixCache
from engine.cache.page_pool import PagePool
from engine.cache.radix_node import RadixNode, path_token_ids
from engine.kv_pool import KVPool


def page_keys(namespace: str, token_ids: Sequence[int], page_size: int,
              num_pages: int | None = None) -> list[bytes]:
    """Key of each whole page of `token_ids` (the first `num_pages`): a hash chain, so key i
    names the tokens of pages 0..i in `namespace`."""
    count = len(token_ids) // page_size if num_pages is None else num_pages
    key = hashlib.blake2b(namespace.encode(), digest_size=16).digest()
    keys: list[bytes] = []
    for i in range(count):
        page = token_ids[i * page_size:(i + 1) * page_size]
        key = hashlib.blake2b(key + b"".join(t.to_bytes(4, "little") for t in page),
                              digest_size=16).digest()
        keys.append(key)
    return keys


class HostTier:
    """`num_pages` host pages shaped like the device pool's, per layer."""

    def __init__(self, kv_pool: KVPool, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError(f"a host KV tier needs at least one page, got {num_pages}")
        self.kv_pool = kv_pool
        self.num_pages = num_pages
        self.page_size = kv_pool.layout.page_size
        device = kv_pool.k[0].device
        pin = device.type == "cuda"
        shape = (num_pages, *kv_pool.k[0].shape[1:])
        dtype = kv_pool.k[0].dtype
        self.k = [torch.zeros(shape, dtype=dtype, pin_memory=pin) for _ in kv_pool.k]
        self.v = [torch.zeros(shape, dtype=dtype, pin_memory=pin) for _ in kv_pool.v]
        self._slots: OrderedDict[bytes, int] = OrderedDict()  # key -> host page, LRU first
        self._free = list(range(num_pages - 1, -1, -1))
        self.num_saved = 0  # pages copied in (evictions)
        self.num_restored = 0  # pages copied back instead of recomputed

    def __contains__(self, key: bytes) -> bool:
        return key in self._slots

    def save_node(self, node: RadixNode) -> None:
        """Copy the pages of `node` (being evicted) in, under their path keys."""
        if not node.page_ids:
            return
        tokens = path_token_ids(node)
        page_size = self.kv_pool.layout.page_size
        keys = page_keys(node.namespace, tokens, page_size)[-len(node.page_ids):]
        for key, page_id in zip(keys, node.page_ids, strict=True):
            self.save(key, page_id)

    def save(self, key: bytes, device_page: int) -> None:
        slot = self._slots.pop(key, None)
        if slot is None:
            slot = self._free.pop() if self._free else self._slots.popitem(last=False)[1]
            for layer in range(len(self.k)):
                self.k[layer][slot].copy_(self.kv_pool.k[layer][device_page])
                self.v[layer][slot].copy_(self.kv_pool.v[layer][device_page])
            self.num_saved += 1
        self._slots[key] = slot  # most recently used

    def load(self, key: bytes, device_page: int) -> bool:
        """Copy the page under `key` into `device_page`. Raises KeyError when absent."""
        slot = self._slots[key]
        self._slots.move_to_end(key)
        for layer in range(len(self.k)):
            self.kv_pool.k[layer][device_page].copy_(self.k[layer][slot], non_blocking=True)
            self.kv_pool.v[layer][device_page].copy_(self.v[layer][slot], non_blocking=True)
        self.num_restored += 1
        return True

    def touch(self, key: bytes) -> None:
        self._slots.move_to_end(key)

    def check_invariants(self) -> None:
        slots = list(self._slots.values())
        assert len(set(slots)) == len(slots), "a host page under two keys"
        assert not set(slots) & set(self._free), "a host page both used and free"
        assert len(slots) + len(self._free) == self.num_pages, "host pages lost"


class KVTier(Protocol):
    """Where `restore` finds pages: a host pool, a directory."""

    page_size: int

    def __contains__(self, key: bytes) -> bool: ...

    def touch(self, key: bytes) -> None: ...

    def load(self, key: bytes, device_page: int) -> bool:
        """Copy the page under `key` into `device_page`; False when it cannot be read."""
        ...

    def check_invariants(self) -> None: ...


def restore(tier: KVTier, cache: PrefixCache, pool: PagePool, namespace: str,
            token_ids: Sequence[int], max_pages: int) -> int:
    """Bring the tier's pages that continue the cached prefix of `token_ids` (up to `max_pages`
    pages of it in all) into the device pool and the radix cache. Evicts cache for room. Returns
    the number of pages restored."""
    page_size = tier.page_size
    match = cache.match_prefix(namespace, token_ids)
    first = len(match.page_ids)
    if first >= max_pages:
        return 0
    keys = page_keys(namespace, token_ids, page_size, max_pages)[first:]
    run = 0
    while run < len(keys) and keys[run] in tier:
        tier.touch(keys[run])  # not dropped by the room made below
        run += 1
    if run == 0:
        return 0
    cache.lock(match.node)
    try:
        if pool.num_free_pages < run:
            cache.evict(run - pool.num_free_pages)
        new_pages = pool.alloc(min(run, pool.num_free_pages))
        loaded = 0
        for key, page_id in zip(keys, new_pages, strict=False):
            if not tier.load(key, page_id):
                break
            loaded += 1
        if loaded:
            end = (first + loaded) * page_size
            cache.insert(namespace, token_ids[:end], [*match.page_ids, *new_pages[:loaded]])
        pool.decref(new_pages)  # the cache holds the loaded ones now; the rest go back
    finally:
        cache.unlock(match.node)
    return loaded
