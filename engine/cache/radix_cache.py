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
from typing import Final

from engine.cache.base import CacheNode, InsertResult, MatchResult, TurnRef
from engine.cache.page_pool import PagePool
from engine.cache.radix_node import RadixNode, path_token_ids

__all__ = ["RadixCache", "RadixNode"]


class RadixCache:
    """Radix-tree `PrefixCache` with LRU eviction, turn bindings and TTL pins."""

    def __init__(self, page_pool: PagePool, page_size: int,
                 clock: Callable[[], float] = time.monotonic,
                 on_evict: Callable[[RadixNode], None] | None = None) -> None:
        """`on_evict(leaf)` runs before an evicted leaf's pages are let go (a host tier copies
        them)."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_pool: Final = page_pool
        self.page_size: Final = page_size
        self._clock = clock
        self._on_evict = on_evict
        self._next_node_id = 0
        self._roots: dict[str, RadixNode] = {}
        self._leaves: set[RadixNode] = set()  # non-root nodes without children
        self._turns: dict[str, tuple[RadixNode, tuple[int, ...]]] = {}  # turn -> (node, tail)
        self._pin_expiry: dict[str, float] = {}  # only for bound turns
        self._num_cached_pages = 0
        self._num_locked_pages = 0

    @property
    def num_cached_pages(self) -> int:
        return self._num_cached_pages

    @property
    def num_evictable_pages(self) -> int:
        return self._num_cached_pages - self._num_locked_pages

    @property
    def num_locked_pages(self) -> int:
        return self._num_locked_pages

    @property
    def num_pins(self) -> int:
        return len(self._pin_expiry)

    def match_prefix(self, namespace: str, token_ids: Sequence[int]) -> MatchResult:
        node, page_ids = self._walk(namespace, token_ids)
        return MatchResult(node, page_ids, len(page_ids) * self.page_size)

    def cached_prefix_len(self, namespace: str, token_ids: Sequence[int]) -> int:
        ps = self.page_size
        node, pos = self._roots.get(namespace), 0
        end = len(token_ids) // ps * ps
        while node is not None and pos < end:
            child = node.children.get(tuple(token_ids[pos : pos + ps]))
            if child is None:
                break
            limit = min(len(child.token_ids), end - pos)
            num_common = ps  # the key matched the first page
            while num_common < limit and child.token_ids[num_common] == token_ids[pos + num_common]:
                num_common += 1
            pos += num_common // ps * ps
            node = child if num_common == len(child.token_ids) else None
        return pos

    def insert(
        self, namespace: str, token_ids: Sequence[int], page_ids: Sequence[int]
    ) -> InsertResult:
        num_pages = len(token_ids) // self.page_size
        if len(page_ids) != num_pages:
            raise ValueError(f"{len(token_ids)} tokens need {num_pages} pages, got {len(page_ids)}")
        node, matched_page_ids = self._walk(namespace, token_ids)
        start = len(matched_page_ids)
        if start == num_pages:
            return InsertResult(node, 0)
        new_page_ids = list(page_ids[start:])
        self.page_pool.incref(new_page_ids)
        run = tuple(token_ids[start * self.page_size : num_pages * self.page_size])
        child = self._new_node(node, run, new_page_ids)  # `node` was touched by the walk
        node.children[run[: self.page_size]] = child
        self._leaves.discard(node)
        self._leaves.add(child)
        self._num_cached_pages += len(new_page_ids)
        return InsertResult(child, len(new_page_ids))

    def lock(self, node: CacheNode) -> None:
        target = self._own(node)
        if target.parent is not None:  # a root holds no pages
            target.num_direct_locks += 1
            self._add_lock_ref(target, 1)

    def unlock(self, node: CacheNode) -> None:
        target = self._own(node)
        if target.parent is not None:
            if target.num_direct_locks == 0:
                raise AssertionError(f"unlock of node {target.node_id}, which holds no lock")
            target.num_direct_locks -= 1
            self._add_lock_ref(target, -1)

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
        self.page_pool.check_invariants()
        ps = self.page_size
        nodes: set[RadixNode] = set()
        page_ids: set[int] = set()
        num_locked = 0
        for namespace, root in self._roots.items():
            assert root.parent is None and root.namespace == namespace, f"bad root {namespace!r}"
            assert not root.page_ids and not root.lock_ref, f"root {namespace!r} holds or locked"
            stack = [root]
            while stack:
                node = stack.pop()
                where = f"node {node.node_id} in {namespace!r}"
                assert node not in nodes and not node.is_removed, f"{where}: reached twice/removed"
                nodes.add(node)
                stack.extend(node.children.values())
                for turn_id in node.turn_ids:
                    assert self._turns.get(turn_id, (None,))[0] is node, f"{where}: stray {turn_id}"
                if node is root:
                    continue
                parent = node.parent
                assert parent in nodes and node.namespace == namespace, f"{where}: bad parent"
                assert parent.children.get(node.token_ids[:ps]) is node, f"{where}: key/link"
                assert node.token_ids and len(node.token_ids) % ps == 0, f"{where}: run length"
                assert len(node.page_ids) * ps == len(node.token_ids), f"{where}: page count"
                assert node.depth_len == parent.depth_len + len(node.token_ids), f"{where}: depth"
                num_locks = node.num_direct_locks + sum(c.lock_ref for c in node.children.values())
                assert node.num_direct_locks >= 0 and node.lock_ref == num_locks, f"{where}: locks"
                num_locked += len(node.page_ids) if node.lock_ref else 0
                for page_id in node.page_ids:
                    assert page_id not in page_ids, f"{where}: page {page_id} in two nodes"
                    assert self.page_pool.ref_count(page_id) >= 1, f"{where}: freed page {page_id}"
                    page_ids.add(page_id)
        assert len(page_ids) == self._num_cached_pages, f"cached {self._num_cached_pages}"
        assert num_locked == self._num_locked_pages, f"locked {self._num_locked_pages}"
        leaves = {node for node in nodes if node.parent is not None and not node.children}
        assert leaves == self._leaves, "leaf set out of date"
        for turn_id, (node, _) in self._turns.items():
            assert node in nodes and turn_id in node.turn_ids, f"turn {turn_id}: node not in tree"
        assert self._pin_expiry.keys() <= self._turns.keys(), "pin on an unbound turn"

    def _root(self, namespace: str) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            self._next_node_id += 1
            root = RadixNode(self._next_node_id, namespace, None, (), [], 0, self._clock())
            self._roots[namespace] = root
        return root

    def _new_node(self, parent: RadixNode, run: tuple[int, ...], page_ids: list[int]) -> RadixNode:
        self._next_node_id += 1
        depth, t = parent.depth_len + len(run), parent.last_access
        return RadixNode(self._next_node_id, parent.namespace, parent, run, page_ids, depth, t)

    def _own(self, node: CacheNode) -> RadixNode:
        if not isinstance(node, RadixNode) or node.is_removed:
            raise ValueError(f"not a live RadixNode (evicted or foreign): {node!r}")
        return node

    def _walk(self, namespace: str, token_ids: Sequence[int]) -> tuple[RadixNode, list[int]]:
        """Follow the longest cached whole-page prefix, splitting at its end; touch the path."""
        ps = self.page_size
        end = len(token_ids) // ps * ps
        now = self._clock()
        node = self._root(namespace)
        node.last_access = now
        page_ids: list[int] = []
        while len(page_ids) * ps < end:
            pos = len(page_ids) * ps
            child = node.children.get(tuple(token_ids[pos : pos + ps]))
            if child is None:
                break
            limit = min(len(child.token_ids), end - pos)
            num_common = ps  # the key matched the first page
            while num_common < limit and child.token_ids[num_common] == token_ids[pos + num_common]:
                num_common += 1
            is_partial = num_common < len(child.token_ids)
            if is_partial:
                child = self._split(child, num_common // ps)
            child.last_access = now
            page_ids.extend(child.page_ids)
            node = child
            if is_partial:
                break
        return node, page_ids

    def _split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut `node` after `num_pages` pages; return the new upper part. The lower part keeps the
        object (its locks, turns, depth), so a handle keeps meaning "the path ending here"."""
        ps = self.page_size
        parent = node.parent
        assert parent is not None and 0 < num_pages < len(node.page_ids)
        cut = num_pages * ps
        upper = self._new_node(parent, node.token_ids[:cut], node.page_ids[:num_pages])
        upper.lock_ref = node.lock_ref  # same locked descendants, so the same page category
        parent.children[upper.token_ids[:ps]] = upper
        node.token_ids = node.token_ids[cut:]
        node.page_ids = node.page_ids[num_pages:]
        node.parent = upper
        upper.children[node.token_ids[:ps]] = node
        return upper

    def _add_lock_ref(self, node: RadixNode, delta: int) -> None:
        """Add `delta` to lock_ref on node..root (exclusive), moving pages evictable <-> locked."""
        walk = node
        while walk.parent is not None:
            walk.lock_ref += delta
            if walk.lock_ref == max(delta, 0):  # went 0 -> 1 or 1 -> 0
                self._num_locked_pages += delta * len(walk.page_ids)
            walk = walk.parent

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
        return len(leaf.page_ids)
