"""PagePool: exact examples plus a Hypothesis state machine against a dict of ref counts."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.cache.page_pool import PagePool
from engine.errors import KVCacheExhausted


def test_alloc_takes_free_pages_with_ref_count_one() -> None:
    pool = PagePool(4)
    page_ids = pool.alloc(3)
    assert sorted(page_ids) == sorted(set(page_ids)) and len(page_ids) == 3
    assert all(pool.ref_count(page_id) == 1 for page_id in page_ids)
    assert (pool.num_free_pages, pool.num_used_pages, pool.num_pages) == (1, 3, 4)
    assert pool.alloc(0) == []
    pool.check_invariants()


def test_alloc_too_many_raises_and_allocates_nothing() -> None:
    pool = PagePool(4)
    pool.alloc(3)
    with pytest.raises(KVCacheExhausted):
        pool.alloc(2)
    assert pool.num_free_pages == 1
    pool.check_invariants()


def test_page_returns_to_pool_only_when_last_reference_dropped() -> None:
    pool = PagePool(2)
    (page_id,) = pool.alloc(1)
    pool.incref([page_id])  # a second holder (e.g. the radix tree)
    pool.decref([page_id])
    assert pool.ref_count(page_id) == 1 and pool.num_free_pages == 1
    pool.decref([page_id])
    assert pool.ref_count(page_id) == 0 and pool.num_free_pages == 2
    pool.check_invariants()


def test_double_free_raises_and_changes_nothing() -> None:
    pool = PagePool(3)
    page_a, page_b = pool.alloc(2)
    with pytest.raises(AssertionError):
        pool.decref([page_a, page_b, page_b])  # page_b only has one reference
    assert pool.ref_count(page_a) == 1 and pool.ref_count(page_b) == 1
    pool.decref([page_a])
    with pytest.raises(AssertionError):
        pool.decref([page_a])
    pool.check_invariants()


def test_incref_of_free_page_raises() -> None:
    pool = PagePool(2)
    with pytest.raises(AssertionError):
        pool.incref([0])
    with pytest.raises(IndexError):
        pool.ref_count(2)
    pool.check_invariants()


def test_incref_counts_duplicates() -> None:
    pool = PagePool(2)
    (page_id,) = pool.alloc(1)
    pool.incref([page_id, page_id])
    assert pool.ref_count(page_id) == 3


class PagePoolMachine(RuleBasedStateMachine):
    """Drive alloc / incref / decref against a plain dict of ref counts."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = PagePool(8)
        self.model: dict[int, int] = {}  # page id -> ref count, used pages only

    @rule(num_pages=st.integers(0, 4))
    def alloc(self, num_pages: int) -> None:
        num_free = 8 - len(self.model)
        if num_pages > num_free:
            with pytest.raises(KVCacheExhausted):
                self.pool.alloc(num_pages)
            return
        page_ids = self.pool.alloc(num_pages)
        assert not set(page_ids) & self.model.keys(), "allocated a page that is in use"
        self.model.update(dict.fromkeys(page_ids, 1))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def incref(self, data: st.DataObject) -> None:
        page_ids = data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=3))
        self.pool.incref(page_ids)
        for page_id in page_ids:
            self.model[page_id] += 1

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def decref(self, data: st.DataObject) -> None:
        page_ids = data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=3))
        counts = {page_id: page_ids.count(page_id) for page_id in page_ids}
        if any(count > self.model[page_id] for page_id, count in counts.items()):
            with pytest.raises(AssertionError):
                self.pool.decref(page_ids)
            return
        self.pool.decref(page_ids)
        for page_id, count in counts.items():
            self.model[page_id] -= count
            if self.model[page_id] == 0:
                del self.model[page_id]

    @invariant()
    def matches_model(self) -> None:
        self.pool.check_invariants()
        assert self.pool.num_used_pages == len(self.model)
        for page_id in range(8):
            assert self.pool.ref_count(page_id) == self.model.get(page_id, 0)


PagePoolMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
TestPagePoolMachine = PagePoolMachine.TestCase
