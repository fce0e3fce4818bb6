"""RadixCache: exact-order examples with a fake clock, plus a Hypothesis state machine.

The state machine plays the scheduler: simulated requests match, lock, incref, alloc (evicting
when short), insert, bind turns, then decref and unlock. Every page remembers which
(namespace, token prefix) its KV was written for, so a match that returns a wrong page is caught.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.cache import (
    CacheNode,
    MatchResult,
    PagePool,
    RadixCache,
    RadixNode,
)
from engine.errors import KVCacheExhausted
from tests.engine.cache.helpers import FakeClock

NAMESPACES = ("a", "b")
TURN_IDS = ("t0", "t1", "t2", "t3")
# Fresh queries: random, or a cut of a shared base path plus noise, so prefixes collide.
BASE_PATHS = ((0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3), (0, 1, 2, 3, 3, 2, 1, 0, 0, 0), (2,) * 12)
token_lists = st.one_of(
    st.lists(st.integers(0, 3), max_size=12),
    st.builds(
        lambda base, num_dropped, tail: (*base[: len(base) - num_dropped], *tail),
        st.sampled_from(BASE_PATHS),
        st.integers(0, 12),
        st.lists(st.integers(0, 3), max_size=3),
    ),
)
namespaces = st.sampled_from(NAMESPACES)
indices = st.integers(0, 1_000)


@dataclass
class SimRequest:
    namespace: str
    token_ids: tuple[int, ...]
    page_ids: list[int]  # cached prefix pages, then new full pages, then maybe a partial page
    node: CacheNode  # the matched node, locked while the request runs
    cached_len: int


class RadixCacheMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]), num_pages=st.sampled_from([8, 16, 40]))
    def setup(self, page_size: int, num_pages: int) -> None:
        self.clock = FakeClock()
        self.pool = PagePool(num_pages)
        self.cache = RadixCache(self.pool, page_size, clock=self.clock)
        self.ps = page_size
        self.inserted: dict[str, set[tuple[int, ...]]] = {ns: set() for ns in NAMESPACES}
        # page id -> (namespace, token prefix its KV was computed for), set at alloc
        self.page_content: dict[int, tuple[str, tuple[int, ...]]] = {}
        self.requests: list[SimRequest] = []
        self.locks: list[tuple[str, tuple[int, ...], CacheNode]] = []
        self.bound: dict[str, tuple[str, tuple[int, ...]]] = {}  # may outlive eviction
        self.pin_expiry: dict[str, float] = {}  # may outlive the binding's eviction

    def check_match(self, namespace: str, token_ids: tuple[int, ...], match: MatchResult) -> None:
        assert match.cached_len == len(match.page_ids) * self.ps <= len(token_ids)
        prefix = token_ids[: match.cached_len]
        if prefix:
            assert any(seq[: len(prefix)] == prefix for seq in self.inserted[namespace])
        for i, page_id in enumerate(match.page_ids):
            expected = (namespace, token_ids[: (i + 1) * self.ps])
            assert self.page_content[page_id] == expected, "match returned a page of other KV"
        # Locked paths stay matchable, so a query extending one matches at least that far.
        for ns, locked_prefix, _ in self.held_paths():
            if ns == namespace and token_ids[: len(locked_prefix)] == locked_prefix:
                assert match.cached_len >= len(locked_prefix)

    def draw_tokens(self, data: st.DataObject, namespace: str) -> tuple[int, ...]:
        """Usually a cut of an inserted sequence plus a few tokens, so prefixes hit and split."""
        inserted = sorted(self.inserted[namespace])
        if inserted and data.draw(st.integers(0, 3), label="reuse") > 0:
            base = data.draw(st.sampled_from(inserted), label="base")
            num_dropped = data.draw(st.integers(0, len(base)), label="num_dropped")
            tail = data.draw(st.lists(st.integers(0, 3), max_size=4), label="tail")
            return base[: len(base) - num_dropped] + tuple(tail)
        return tuple(data.draw(token_lists, label="tokens"))

    def held_paths(self) -> list[tuple[str, tuple[int, ...], CacheNode]]:
        held = [(r.namespace, r.token_ids[: r.cached_len], r.node) for r in self.requests]
        return held + self.locks

    def start(self, namespace: str, tokens: tuple[int, ...]) -> SimRequest | None:
        """Admit a request like the scheduler: match, lock, incref, alloc (evicting if short)."""
        match = self.cache.match_prefix(namespace, tokens)
        self.check_match(namespace, tokens, match)
        self.cache.lock(match.node)
        self.pool.incref(match.page_ids)
        num_needed = -(-len(tokens) // self.ps) - len(match.page_ids)  # incl. a partial page
        if num_needed > self.pool.num_free_pages:
            self.cache.evict(num_needed - self.pool.num_free_pages)
        try:
            new_page_ids = self.pool.alloc(num_needed)
        except KVCacheExhausted:
            self.cache.unlock(match.node)
            self.pool.decref(match.page_ids)
            return None
        for i, page_id in enumerate(new_page_ids, start=len(match.page_ids)):
            self.page_content[page_id] = (namespace, tokens[: (i + 1) * self.ps])
        page_ids = match.page_ids + new_page_ids
        return SimRequest(namespace, tokens, page_ids, match.node, match.cached_len)

    def finish(self, req: SimRequest, turn_id: str | None) -> None:
        """Cache the request's full pages, bind its turn, then drop its references."""
        num_full = len(req.token_ids) // self.ps
        full_tokens = req.token_ids[: num_full * self.ps]
        num_cached_before = self.cache.num_cached_pages
        result = self.cache.insert(req.namespace, req.token_ids, req.page_ids[:num_full])
        assert self.cache.num_cached_pages == num_cached_before + result.num_new_pages
        self.inserted[req.namespace].add(full_tokens)
        match = self.cache.match_prefix(req.namespace, req.token_ids)
        assert match.cached_len == len(full_tokens) and match.node is result.node
        if turn_id is not None:
            was_bound = self.cache.lookup_turn(turn_id) is not None
            self.cache.bind_turn(turn_id, result.node, req.token_ids[num_full * self.ps :])
            self.bound[turn_id] = (req.namespace, req.token_ids)
            if not was_bound:  # an evicted binding took its pin along
                self.pin_expiry.pop(turn_id, None)
        self.pool.decref(req.page_ids)
        self.cache.unlock(req.node)

    @rule(namespace=namespaces, data=st.data())
    def start_request(self, namespace: str, data: st.DataObject) -> None:
        req = self.start(namespace, self.draw_tokens(data, namespace))
        if req is not None:
            self.requests.append(req)

    @precondition(lambda self: self.requests)
    @rule(index=indices, turn_id=st.none() | st.sampled_from(TURN_IDS))
    def finish_request(self, index: int, turn_id: str | None) -> None:
        self.finish(self.requests.pop(index % len(self.requests)), turn_id)

    @rule(namespace=namespaces, data=st.data(), turn_id=st.none() | st.sampled_from(TURN_IDS))
    def serve_request(self, namespace: str, data: st.DataObject, turn_id: str | None) -> None:
        """A whole request lifecycle in one step, so trees grow within few steps."""
        req = self.start(namespace, self.draw_tokens(data, namespace))
        if req is not None:
            self.finish(req, turn_id)

    @precondition(lambda self: self.requests)
    @rule(index=indices)
    def abort_request(self, index: int) -> None:
        req = self.requests.pop(index % len(self.requests))
        self.pool.decref(req.page_ids)
        self.cache.unlock(req.node)

    @rule(namespace=namespaces, data=st.data())
    def match(self, namespace: str, data: st.DataObject) -> None:
        tokens = self.draw_tokens(data, namespace)
        probed = self.cache.cached_prefix_len(namespace, tokens)  # read-only: same answer
        match = self.cache.match_prefix(namespace, tokens)
        assert probed == match.cached_len
        self.check_match(namespace, tokens, match)

    @rule(namespace=namespaces, data=st.data())
    def lock(self, namespace: str, data: st.DataObject) -> None:
        tokens = self.draw_tokens(data, namespace)
        match = self.cache.match_prefix(namespace, tokens)
        self.cache.lock(match.node)
        self.locks.append((namespace, tokens[: match.cached_len], match.node))

    @precondition(lambda self: self.locks)
    @rule(index=indices)
    def unlock(self, index: int) -> None:
        self.cache.unlock(self.locks.pop(index % len(self.locks))[2])

    def eviction_keys(self) -> dict[RadixNode, tuple[bool, float]]:
        """White-box: (has a live pin, last access) of every non-root node, pins from the model."""
        refs = [(self.cache.lookup_turn(t), expiry) for t, expiry in self.pin_expiry.items()]
        pinned = {ref.node for ref, expiry in refs if ref and self.clock.now <= expiry}
        keys = {}
        stack = list(self.cache._roots.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.parent is not None:
                keys[node] = (node in pinned, node.last_access)
        return keys

    @rule(num_pages=st.integers(0, 4))
    def evict(self, num_pages: int) -> None:
        before = (self.cache.num_cached_pages, self.cache.num_evictable_pages)
        num_locked = self.cache.num_locked_pages
        keys = self.eviction_keys()
        candidates = [node for node in keys if not node.children and node.lock_ref == 0]
        num_evicted = self.cache.evict(num_pages)
        assert self.cache.num_cached_pages == before[0] - num_evicted
        assert min(num_pages, before[1]) <= num_evicted <= before[1]
        assert self.cache.num_locked_pages == num_locked
        evicted = [node for node in keys if node.is_removed]
        assert sum(len(node.page_ids) for node in evicted) == num_evicted
        # Unpinned before pinned, then LRU: nothing evicted sorts after a leaf that was kept.
        kept = [keys[node] for node in candidates if not node.is_removed]
        if evicted and kept:
            assert max(keys[node] for node in evicted) <= min(kept), "eviction out of order"

    @rule(
        turn_id=st.sampled_from(TURN_IDS),
        op=st.sampled_from(["pin", "unpin", "unbind", "lookup"]),
        ttl_s=st.sampled_from([0.0, 1.0, 5.0, math.inf]),
    )
    def turn_op(self, turn_id: str, op: str, ttl_s: float) -> None:
        """One rule for all turn operations, so request rules keep a fair share of the steps."""
        is_bound = self.cache.lookup_turn(turn_id) is not None
        if not is_bound:
            self.pin_expiry.pop(turn_id, None)  # dropped with its binding
        if op == "pin":
            assert self.cache.pin(turn_id, ttl_s) == is_bound
            if is_bound:
                self.pin_expiry[turn_id] = self.clock.now + ttl_s
        elif op == "unpin":
            assert self.cache.unpin(turn_id) == (self.pin_expiry.pop(turn_id, None) is not None)
        elif op == "unbind":
            assert self.cache.unbind_turn(turn_id) == is_bound
            self.bound.pop(turn_id, None)
            self.pin_expiry.pop(turn_id, None)
        else:
            self.check_lookup(turn_id)

    def check_lookup(self, turn_id: str) -> None:
        ref = self.cache.lookup_turn(turn_id)
        if turn_id not in self.bound:
            assert ref is None
            return
        namespace, tokens = self.bound[turn_id]
        num_cached = len(tokens) // self.ps * self.ps
        if ref is None:
            assert num_cached > 0, "a turn bound to the root was dropped"
            del self.bound[turn_id]  # its node was evicted
            return
        assert (ref.namespace, ref.cached_len) == (namespace, num_cached)
        assert ref.token_ids == list(tokens)
        assert self.cache.match_prefix(namespace, tokens).node is ref.node

    @rule(dt=st.sampled_from([0.5, 1.0, 3.0]))
    def advance_clock(self, dt: float) -> None:
        self.clock.now += dt

    @invariant()
    def consistent(self) -> None:
        self.cache.check_invariants()
        cache = self.cache
        assert cache.num_evictable_pages + cache.num_locked_pages == cache.num_cached_pages
        # Every reference is the tree's (at most one per page) or a request's.
        held = Counter(page_id for req in self.requests for page_id in req.page_ids)
        tree_refs = [self.pool.ref_count(p) - held[p] for p in range(self.pool.num_pages)]
        assert set(tree_refs) <= {0, 1} and sum(tree_refs) == cache.num_cached_pages
        for namespace, prefix, node in self.held_paths():
            match = cache.match_prefix(namespace, prefix)
            assert match.cached_len == len(prefix) and match.node is node, "locked path lost"

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        for _, _, node in self.locks:
            self.cache.unlock(node)
        for req in self.requests:
            self.pool.decref(req.page_ids)
            self.cache.unlock(req.node)
        self.cache.reset()
        self.cache.check_invariants()
        assert self.cache.num_cached_pages == 0
        assert self.pool.num_free_pages == self.pool.num_pages, "leaked pages"
        for turn_id in TURN_IDS:
            ref = self.cache.lookup_turn(turn_id)
            assert ref is None or ref.cached_len == 0


RadixCacheMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
TestRadixCacheMachine = RadixCacheMachine.TestCase
