"""KV page bookkeeping and the prefix cache (pure Python: page ids are ints)."""

from engine.cache.base import CacheNode, InsertResult, MatchResult, PrefixCache, TurnRef
from engine.cache.no_cache import NoPrefixCache, NullNode
from engine.cache.page_pool import PagePool
from engine.cache.radix_cache import RadixCache, RadixNode

__all__ = [
    "CacheNode",
    "InsertResult",
    "MatchResult",
    "NoPrefixCache",
    "NullNode",
    "PagePool",
    "PrefixCache",
    "RadixCache",
    "RadixNode",
    "TurnRef",
]
