"""Radix prefix cache: per-namespace trees of token-id runs at page granularity.

Each non-root node holds a run of whole pages (token ids, length a multiple of page_size) and one
page id per page. Children are keyed by the token ids of their first page. The tree owns one pool
reference per page in its nodes; the contract is documented on `engine.cache.base.PrefixCache`.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence

from engine.cache import swa_pages
from engine.cache.base import CacheNode, InsertResult, MatchResult, SlidingWindow, TurnRef
from engine.cache.page_pool import PagePool
from engine.cache.radix_node import RadixNode, path_token_ids
from engine.cache.radix_tree import RadixTree

__all__ = ["RadixCache", "RadixNode"]


class RadixCache(RadixTree):
    """Radix-tree `PrefixCache` with LRU eviction, turn bindings and TTL pins."""

    def __init__(self, page_pool: PagePool, page_size: int,
                 clock: Callable[[], float] = time.monotonic,
                 on_evict: Callable[[RadixNode], None] | None = None,
                 swa: SlidingWindow | None = None) -> None:
        """`on_evict(leaf)` runs before an evicted leaf's pages are let go (a host tier copies
        them). `swa`: the sliding-window layers' pages are kept per node too, and may be given
        back on their own (engine.cache.swa_pages)."""
        super().__init__(page_pool, page_size, clock)
        self._on_evict = on_evict
        self._turns: dict[str, tuple[RadixNode, tuple[int, ...]]] = {}  # turn -> (node, tail)
        self._pin_expiry: dict[str, float] = {}  # only for bound turns
        self.swa = swa
        self._num_cached_swa = 0  # sliding-window pages the tree holds

    @property
    def num_pins(self) -> int:
        return len(self._pin_expiry)

    def match_prefix(self, namespace: str, token_ids: Sequence[int]) -> MatchResult:
        node, page_ids, swa_ids = self._walk(namespace, token_ids)
        if self.swa is not None:
            usable = swa_pages.usable_pages(swa_ids, self.swa, self.page_size)
            if usable < len(page_ids):  # the window before the end was given back
                node, page_ids, swa_ids = self._walk(namespace,
                                                     token_ids[: usable * self.page_size])
        return MatchResult(node, page_ids, len(page_ids) * self.page_size, swa_ids)

    def insert(
        self, namespace: str, token_ids: Sequence[int], page_ids: Sequence[int],
        swa_page_ids: Sequence[int] | None = None,
    ) -> InsertResult:
        num_pages = len(token_ids) // self.page_size
        if len(page_ids) != num_pages:
            raise ValueError(f"{len(token_ids)} tokens need {num_pages} pages, got {len(page_ids)}")
        swa_ids = list(swa_page_ids or [])
        if self.swa is not None and len(swa_ids) != num_pages:
            raise ValueError(f"{num_pages} pages need as many sliding-window pages, got "
                             f"{len(swa_ids)}")
        node, matched_page_ids, _ = self._walk(namespace, token_ids)
        start = len(matched_page_ids)
        if self.swa is not None and start:
            self._num_cached_swa += swa_pages.adopt_into_path(node, swa_ids, self.swa.pool)
        if start == num_pages:
            return InsertResult(node, 0)
        new_page_ids = list(page_ids[start:])
        self.page_pool.incref(new_page_ids)
        new_swa = None
        if self.swa is not None:
            new_swa = swa_ids[start:]
            held = swa_pages.live(new_swa)
            self.swa.pool.incref(held)
            self._num_cached_swa += len(held)
        run = tuple(token_ids[start * self.page_size : num_pages * self.page_size])
        child = self._new_node(node, run, new_page_ids, new_swa)  # the walk touched `node`
        node.children[run[: self.page_size]] = child
        self._leaves.discard(node)
        self._leaves.add(child)
        self._num_cached_pages += len(new_page_ids)
        return InsertResult(child, len(new_page_ids))

    def evict(self, num_pages: int) -> int:
        if num_pages <= 0:
            return 0
        now = self._clock()
        # Keys are computed once per call: pins expire against one `now`.
        heap = [self._evict_key(leaf, now) for leaf in self._leaves if leaf.lock_ref == 0]
        heapq.heapify(heap)
        num_evicted = 0
        while heap and num_evicted < num_pages:
            leaf = heapq.heappop(heap)[3]
            parent = leaf.parent
            assert parent is not None
            num_evicted += self._remove_leaf(leaf)
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, self._evict_key(parent, now))
        return num_evicted

    def evict_swa(self, num_pages: int) -> int:
        if self.swa is None or num_pages <= 0:
            return 0
        now = self._clock()
        inner = [n for root in self._roots.values() for n in self._descendants(root)
                 if n.children and n.lock_ref == 0]
        freed = swa_pages.give_back_inner(inner, num_pages, self.swa.pool,
                                          lambda n: self._evict_key(n, now)[:3])
        self._num_cached_swa -= freed
        while freed < num_pages and self._leaves:
            before = self.swa.pool.num_free_pages
            if not self.evict(1):
                break
            freed += self.swa.pool.num_free_pages - before
        return freed

    @property
    def num_cached_swa_pages(self) -> int:
        """Sliding-window pages the tree holds a reference on."""
        return self._num_cached_swa

    def bind_turn(self, turn_id: str, node: CacheNode, tail_token_ids: Sequence[int]) -> None:
        target = self._own(node)
        old = self._turns.get(turn_id)
        if old is not None:
            old[0].turn_ids.discard(turn_id)
        target.turn_ids.add(turn_id)
        self._turns[turn_id] = (target, tuple(tail_token_ids))

    def lookup_turn(self, turn_id: str) -> TurnRef | None:
        binding = self._turns.get(turn_id)
        if binding is None:
            return None
        node, tail = binding
        return TurnRef(node, node.namespace, [*path_token_ids(node), *tail], node.depth_len)

    def unbind_turn(self, turn_id: str) -> bool:
        self._pin_expiry.pop(turn_id, None)
        binding = self._turns.pop(turn_id, None)
        if binding is not None:
            binding[0].turn_ids.discard(turn_id)
        return binding is not None

    def pin(self, turn_id: str, ttl_s: float) -> bool:
        if ttl_s < 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        if turn_id in self._turns:
            self._pin_expiry[turn_id] = self._clock() + ttl_s
        return turn_id in self._turns

    def unpin(self, turn_id: str) -> bool:
        return self._pin_expiry.pop(turn_id, None) is not None

    def reset(self) -> None:
        self.evict(self._num_cached_pages)

    def check_invariants(self) -> None:
        swa_seen: set[int] = set()

        def check_node(node: RadixNode, where: str) -> None:
            for turn_id in node.turn_ids:
                assert self._turns.get(turn_id, (None,))[0] is node, f"{where}: stray {turn_id}"
            if self.swa is not None:
                swa_pages.check_node(node, self.swa.pool, swa_seen, where)

        nodes = self._check_tree(check_node)
        assert len(swa_seen) == self._num_cached_swa, f"cached sliding {self._num_cached_swa}"
        if self.swa is not None:
            self.swa.pool.check_invariants()
        for turn_id, (node, _) in self._turns.items():
            assert node in nodes and turn_id in node.turn_ids, f"turn {turn_id}: node not in tree"
        assert self._pin_expiry.keys() <= self._turns.keys(), "pin on an unbound turn"

    def _evict_key(self, node: RadixNode, now: float) -> tuple[bool, float, int, RadixNode]:
        """Unpinned (or expired) before pinned, then least recently used."""
        expiry = max((self._pin_expiry.get(t, -math.inf) for t in node.turn_ids), default=-math.inf)
        return (now <= expiry, node.last_access, node.node_id, node)

    def _remove_leaf(self, leaf: RadixNode) -> int:
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.lock_ref == 0
        if self._on_evict is not None:
            self._on_evict(leaf)
        del parent.children[leaf.token_ids[: self.page_size]]
        self._leaves.discard(leaf)
        if parent.parent is not None and not parent.children:
            self._leaves.add(parent)
        for turn_id in leaf.turn_ids:
            del self._turns[turn_id]
            self._pin_expiry.pop(turn_id, None)
        leaf.turn_ids.clear()
        leaf.is_removed = True
        self.page_pool.decref(leaf.page_ids)
        self._num_cached_pages -= len(leaf.page_ids)
        if self.swa is not None and leaf.swa_page_ids is not None:
            held = swa_pages.live(leaf.swa_page_ids)
            self.swa.pool.decref(held)
            self._num_cached_swa -= len(held)
        return len(leaf.page_ids)
