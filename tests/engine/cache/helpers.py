"""Shared helpers of the radix cache tests: a fake clock and a cache that fills like a request."""

from __future__ import annotations

from engine.cache import CacheNode, PagePool, RadixCache


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_cache(page_size: int = 2, num_pages: int = 32) -> tuple[RadixCache, PagePool, FakeClock]:
    pool = PagePool(num_pages)
    clock = FakeClock()
    return RadixCache(pool, page_size, clock=clock), pool, clock


def cache_tokens(cache: RadixCache, namespace: str, token_ids: list[int]) -> CacheNode:
    """What a finished request does: alloc its full pages, insert them, drop its own refs."""
    page_ids = cache.page_pool.alloc(len(token_ids) // cache.page_size)
    node = cache.insert(namespace, token_ids, page_ids).node
    cache.page_pool.decref(page_ids)
    cache.check_invariants()
    return node


def is_cached(cache: RadixCache, namespace: str, token_ids: list[int]) -> bool:
    return cache.match_prefix(namespace, token_ids).cached_len == len(token_ids)
