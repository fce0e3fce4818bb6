"""`NoPrefixCache`: the null-object `PrefixCache` behind ``--no-prefix-cache``.

Nothing is ever cached: every match is empty, inserts adopt no pages, and no turn can be looked up,
so the engine answers `UnknownParent` and the gateway resends the full token path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.cache.base import CacheNode, InsertResult, MatchResult, TurnRef
from engine.cache.page_pool import PagePool


@dataclass(frozen=True, slots=True)
class NullNode:
    """The (empty) root of a namespace; the only kind of node this cache hands out."""

    node_id: int
    namespace: str


class NoPrefixCache:
    """A `PrefixCache` that holds nothing."""

    def __init__(self, page_pool: PagePool, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self._page_pool = page_pool
        self._page_size = page_size
        self._roots: dict[str, NullNode] = {}

    @property
    def page_pool(self) -> PagePool:
        return self._page_pool

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def num_cached_pages(self) -> int:
        return 0

    @property
    def num_evictable_pages(self) -> int:
        return 0

    @property
    def num_locked_pages(self) -> int:
        return 0

    @property
    def num_pins(self) -> int:
        return 0

    def match_prefix(self, namespace: str, token_ids: Sequence[int]) -> MatchResult:
        return MatchResult(self._root(namespace), [], 0)

    def cached_prefix_len(self, namespace: str, token_ids: Sequence[int]) -> int:
        return 0

    def insert(
        self, namespace: str, token_ids: Sequence[int], page_ids: Sequence[int],
        swa_page_ids: Sequence[int] | None = None,
    ) -> InsertResult:
        num_pages = len(token_ids) // self._page_size
        if len(page_ids) != num_pages:
            raise ValueError(f"{len(token_ids)} tokens need {num_pages} pages, got {len(page_ids)}")
        return InsertResult(self._root(namespace), 0)

    def lock(self, node: CacheNode) -> None:
        pass

    def unlock(self, node: CacheNode) -> None:
        pass

    def evict(self, num_pages: int) -> int:
        return 0

    def evict_swa(self, num_pages: int) -> int:
        return 0

    def bind_turn(self, turn_id: str, node: CacheNode, tail_token_ids: Sequence[int]) -> None:
        pass

    def lookup_turn(self, turn_id: str) -> TurnRef | None:
        return None

    def unbind_turn(self, turn_id: str) -> bool:
        return False

    def pin(self, turn_id: str, ttl_s: float) -> bool:
        return False

    def unpin(self, turn_id: str) -> bool:
        return False

    def reset(self) -> None:
        pass

    def check_invariants(self) -> None:
        self._page_pool.check_invariants()
        for namespace, root in self._roots.items():
            assert root.namespace == namespace, f"root of {namespace!r} is {root.namespace!r}"
        node_ids = [root.node_id for root in self._roots.values()]
        assert len(set(node_ids)) == len(node_ids), "two roots share a node id"

    def _root(self, namespace: str) -> NullNode:
        root = self._roots.get(namespace)
        if root is None:
            root = NullNode(len(self._roots), namespace)
            self._roots[namespace] = root
        return root
