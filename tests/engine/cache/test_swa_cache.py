"""The radix cache with sliding-window memory: a Hypothesis state machine that plays the
scheduler (match, hold, allocate full and sliding pages, give back the sliding pages a window
has left, insert, evict either kind), and examples of the rules: a prefix is a hit only while
the sliding pages of its last window are held; inner nodes give theirs back first; an insert
fills given-back pages with the caller's."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.cache import CacheNode, PagePool, RadixCache
from engine.cache.base import MatchResult, SlidingWindow
from engine.cache.radix_node import NO_PAGE
from engine.errors import KVCacheExhausted
from tests.engine.cache.helpers import FakeClock

NS = "ns"


@dataclass
class SimRequest:
    tokens: tuple[int, ...]
    page_ids: list[int]
    swa_ids: list[int]
    node: CacheNode


class SwaCacheMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]), window=st.sampled_from([1, 3, 8]),
                num_pages=st.sampled_from([12, 40]), num_swa=st.sampled_from([6, 20]))
    def setup(self, page_size: int, window: int, num_pages: int, num_swa: int) -> None:
        self.ps, self.window = page_size, window
        self.pool, self.swa_pool = PagePool(num_pages), PagePool(num_swa)
        self.swa = SlidingWindow(self.swa_pool, window)
        self.cache = RadixCache(self.pool, page_size, clock=FakeClock(), swa=self.swa)
        self.content: dict[int, tuple[int, ...]] = {}  # page -> tokens its KV ends
        self.swa_content: dict[int, tuple[int, ...]] = {}
        self.inserted: list[tuple[int, ...]] = []
        self.requests: list[SimRequest] = []

    def draw(self, data: st.DataObject) -> tuple[int, ...]:
        if self.inserted and data.draw(st.booleans()):
            base = data.draw(st.sampled_from(self.inserted))
            cut = data.draw(st.integers(0, len(base)))
            return base[:cut] + tuple(data.draw(st.lists(st.integers(0, 2), max_size=4)))
        return tuple(data.draw(st.lists(st.integers(0, 2), max_size=16)))

    def check_match(self, tokens: tuple[int, ...], match: MatchResult) -> None:
        n = len(match.page_ids)
        assert len(match.swa_page_ids) == n and match.cached_len == n * self.ps
        for i, page in enumerate(match.page_ids):
            assert self.content[page] == tokens[: (i + 1) * self.ps], "wrong full page"
        first = self.swa.first_needed_page(n * self.ps, self.ps)
        for i, page in enumerate(match.swa_page_ids):
            if i >= first:
                assert page != NO_PAGE, "a hit whose last window was given back"
            if page != NO_PAGE:
                assert self.swa_pool.ref_count(page) >= 1
                assert self.swa_content[page] == tokens[: (i + 1) * self.ps], "wrong swa page"

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        tokens = self.draw(data)
        match = self.cache.match_prefix(NS, tokens)
        self.check_match(tokens, match)
        self.cache.lock(match.node)
        self.pool.incref(match.page_ids)
        self.swa_pool.incref([p for p in match.swa_page_ids if p != NO_PAGE])
        need = -(-len(tokens) // self.ps) - len(match.page_ids)
        self.cache.evict(max(0, need - self.pool.num_free_pages))
        self.cache.evict_swa(max(0, need - self.swa_pool.num_free_pages))
        held = SimRequest(tokens, match.page_ids, list(match.swa_page_ids), match.node)
        try:
            new = self.pool.alloc(need)
        except KVCacheExhausted:
            self.release(held)
            return
        try:
            new_swa = self.swa_pool.alloc(need)
        except KVCacheExhausted:
            self.pool.decref(new)
            self.release(held)
            return
        base = len(match.page_ids)
        for i, (page, swa_page) in enumerate(zip(new, new_swa, strict=True), start=base):
            self.content[page] = self.swa_content[swa_page] = tokens[: (i + 1) * self.ps]
        req = SimRequest(tokens, match.page_ids + new, list(match.swa_page_ids) + new_swa,
                         match.node)
        # The scheduler's trim: pages out of every window of the computed sequence go back.
        keep_from = self.swa.first_needed_page(len(tokens), self.ps)
        for i in range(min(keep_from, len(req.swa_ids))):
            if req.swa_ids[i] != NO_PAGE:
                self.swa_pool.decref([req.swa_ids[i]])
                req.swa_ids[i] = NO_PAGE
        self.requests.append(req)

    def release(self, req: SimRequest) -> None:
        self.pool.decref(req.page_ids)
        self.swa_pool.decref([p for p in req.swa_ids if p != NO_PAGE])
        self.cache.unlock(req.node)

    @precondition(lambda self: self.requests)
    @rule(index=st.integers(0, 100))
    def finish(self, index: int) -> None:
        req = self.requests.pop(index % len(self.requests))
        n = len(req.tokens) // self.ps
        self.cache.insert(NS, req.tokens[: n * self.ps], req.page_ids[:n], req.swa_ids[:n])
        self.inserted.append(req.tokens[: n * self.ps])
        self.release(req)

    @rule(num_pages=st.integers(0, 6))
    def evict_swa(self, num_pages: int) -> None:
        free = self.swa_pool.num_free_pages
        freed = self.cache.evict_swa(num_pages)
        assert self.swa_pool.num_free_pages == free + freed

    @rule(num_pages=st.integers(0, 4))
    def evict(self, num_pages: int) -> None:
        self.cache.evict(num_pages)

    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        tokens = self.draw(data)
        self.check_match(tokens, self.cache.match_prefix(NS, tokens))

    @invariant()
    def consistent(self) -> None:
        self.cache.check_invariants()
        held = sum(1 for r in self.requests for p in r.swa_ids if p != NO_PAGE)
        assert self.swa_pool.num_used_pages <= held + self.cache.num_cached_swa_pages


TestSwaCacheMachine = SwaCacheMachine.TestCase
TestSwaCacheMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def _cache(window: int = 4) -> tuple[RadixCache, PagePool, PagePool]:
    pool, swa_pool = PagePool(32), PagePool(32)
    return RadixCache(pool, 2, clock=FakeClock(), swa=SlidingWindow(swa_pool, window)), pool, \
        swa_pool


def _insert(cache: RadixCache, pool: PagePool, swa_pool: PagePool, tokens: list[int],
            given_back: set[int]) -> None:
    n = len(tokens) // 2
    pages, swa = pool.alloc(n), swa_pool.alloc(n)
    for i in given_back:
        swa_pool.decref([swa[i]])
        swa[i] = NO_PAGE
    cache.insert(NS, tokens, pages, swa)
    pool.decref(pages)
    swa_pool.decref([p for p in swa if p != NO_PAGE])


def test_a_prefix_whose_window_was_given_back_is_no_hit() -> None:
    cache, pool, swa_pool = _cache(window=4)  # a query at p reads pages from (p - 3) // 2
    _insert(cache, pool, swa_pool, list(range(12)), given_back={0, 1, 2})
    assert cache.match_prefix(NS, list(range(12))).cached_len == 12  # reads pages 4, 5
    assert cache.match_prefix(NS, list(range(10))).cached_len == 10  # reads pages 3, 4
    # Ending at 8 reads pages 2 and 3: page 2 is gone, and every shorter end needs it or older.
    assert cache.match_prefix(NS, list(range(8))).cached_len == 0
    cache.check_invariants()


def test_inner_nodes_give_back_first_and_an_insert_fills_them_again() -> None:
    cache, pool, swa_pool = _cache(window=4)
    _insert(cache, pool, swa_pool, list(range(8)), given_back=set())
    _insert(cache, pool, swa_pool, [*range(8), 20, 21], given_back=set())
    _insert(cache, pool, swa_pool, [*range(8), 30, 31], given_back=set())  # (0..7) is inner
    assert cache.num_cached_swa_pages == 6
    assert cache.evict_swa(1) == 4  # the inner node's four pages, not a leaf's
    assert cache.num_cached_pages == 6 and cache.num_cached_swa_pages == 2
    assert cache.match_prefix(NS, [*range(8), 20, 21]).cached_len == 0  # its window is gone
    _insert(cache, pool, swa_pool, [*range(8), 20, 21], given_back=set())  # fills them
    assert cache.match_prefix(NS, [*range(8), 20, 21]).cached_len == 10
    cache.check_invariants()
