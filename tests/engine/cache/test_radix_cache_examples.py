"""RadixCache: exact-order examples with a fake clock, plus a Hypothesis state machine.

The state machine plays the scheduler: simulated requests match, lock, incref, alloc (evicting
when short), insert, bind turns, then decref and unlock. Every page remembers which
(namespace, token prefix) its KV was written for, so a match that returns a wrong page is caught.
"""

from __future__ import annotations

import pytest

from engine.cache import (
    MatchResult,
    NoPrefixCache,
    PagePool,
    PrefixCache,
)
from tests.engine.cache.helpers import cache_tokens, is_cached, make_cache


def test_match_is_whole_pages_and_splits_a_node() -> None:
    cache, _, _ = make_cache(page_size=2)
    page_ids = cache.page_pool.alloc(3)
    end = cache.insert("ns", [1, 2, 3, 4, 5, 6], page_ids).node
    # The query diverges inside the third page: two pages match, the node splits after them.
    match = cache.match_prefix("ns", [1, 2, 3, 4, 5, 9])
    assert match == MatchResult(match.node, page_ids[:2], 4)
    assert match.node is not end
    # A partial last page never matches.
    assert cache.match_prefix("ns", [1, 2, 3]).page_ids == page_ids[:1]
    # The deeper half kept its identity: the full path still ends at `end`.
    assert cache.match_prefix("ns", [1, 2, 3, 4, 5, 6, 7]).node is end
    assert cache.match_prefix("ns", [2, 2]).cached_len == 0
    cache.check_invariants()


def test_partial_token_match_inside_a_page_does_not_count() -> None:
    cache, _, _ = make_cache(page_size=4)
    page_ids = cache.page_pool.alloc(2)
    cache.insert("ns", list(range(8)), page_ids)
    assert cache.match_prefix("ns", [0, 1, 2, 3, 4, 5, 9, 9]).page_ids == page_ids[:1]
    cache.check_invariants()


def test_namespaces_with_identical_tokens_share_nothing() -> None:
    cache, pool, _ = make_cache()
    tokens = [1, 2, 3, 4]
    pages_a, pages_b = pool.alloc(2), pool.alloc(2)
    cache.insert("tenant-a/m", tokens, pages_a)
    assert cache.insert("tenant-b/m", tokens, pages_b).num_new_pages == 2
    assert cache.match_prefix("tenant-a/m", tokens).page_ids == pages_a
    assert cache.match_prefix("tenant-b/m", tokens).page_ids == pages_b
    assert cache.num_cached_pages == 4
    cache.check_invariants()


def test_duplicate_insert_keeps_tree_pages_and_caller_frees_its_own() -> None:
    cache, pool, _ = make_cache(num_pages=8)
    first = pool.alloc(2)
    assert cache.insert("ns", [1, 2, 3, 4], first).num_new_pages == 2
    pool.decref(first)
    # A second request computed the same prefix into its own pages, plus one more page.
    second = pool.alloc(3)
    assert cache.insert("ns", [1, 2, 3, 4, 5, 6], second).num_new_pages == 1
    pool.decref(second)
    assert [pool.ref_count(page_id) for page_id in second] == [0, 0, 1]
    assert cache.match_prefix("ns", [1, 2, 3, 4, 5, 6]).page_ids == [*first, second[2]]
    assert pool.num_used_pages == cache.num_cached_pages == 3
    cache.check_invariants()


def test_evict_removes_least_recently_used_leaf_first() -> None:
    cache, pool, clock = make_cache(page_size=1)
    for t, first_token in enumerate([1, 2, 3]):
        clock.now = float(t)
        cache_tokens(cache, "ns", [first_token, 0])
    clock.now = 3.0
    cache.match_prefix("ns", [1, 0])  # [1, 0] is now the most recently used
    assert cache.evict(1) == 2  # a whole leaf goes: [2, 0] (t=1)
    assert cache.evict(0) == 0
    clock.now = 4.0  # is_cached() touches what it finds: look only after evicting
    assert not is_cached(cache, "ns", [2]) and is_cached(cache, "ns", [3, 0])
    clock.now = 5.0
    cache.match_prefix("ns", [1, 0])  # [1, 0] again the most recent
    assert cache.evict(1) == 2  # then [3, 0]
    assert is_cached(cache, "ns", [1, 0]) and pool.num_used_pages == 2
    cache.check_invariants()


def test_parent_becomes_evictable_after_its_last_child_goes() -> None:
    cache, pool, clock = make_cache(page_size=1)
    cache_tokens(cache, "ns", [1, 2])
    clock.now = 1.0
    cache_tokens(cache, "ns", [1, 2, 3, 4])  # child of [1, 2], touched later
    clock.now = 2.0
    cache_tokens(cache, "ns", [5])
    # [1, 2] is not a leaf, so [3, 4] (t=1) goes first, then [1, 2] (t=1), then [5] (t=2).
    assert cache.evict(2) == 2 and is_cached(cache, "ns", [1, 2])
    assert cache.evict(1) == 2 and is_cached(cache, "ns", [5])
    assert cache.evict(100) == 1 and pool.num_free_pages == pool.num_pages
    cache.check_invariants()


def test_locked_path_is_never_evicted() -> None:
    cache, _, _ = make_cache(page_size=1)
    node = cache_tokens(cache, "ns", [1, 2, 3])
    cache_tokens(cache, "ns", [1, 2, 9])  # splits [1, 2, 3]: [1, 2] is now an ancestor of both
    cache.lock(node)
    assert (cache.num_locked_pages, cache.num_evictable_pages) == (3, 1)
    assert cache.evict(10) == 1  # only [9]
    assert is_cached(cache, "ns", [1, 2, 3]) and not is_cached(cache, "ns", [1, 2, 9])
    cache.check_invariants()
    cache.unlock(node)
    with pytest.raises(AssertionError):
        cache.unlock(node)
    assert cache.num_locked_pages == 0
    cache.reset()
    assert cache.num_cached_pages == 0 and cache.page_pool.num_free_pages == 32
    with pytest.raises(ValueError):
        cache.lock(node)  # evicted handles are rejected
    cache.check_invariants()


def test_pinned_leaf_is_evicted_after_all_unpinned_ones() -> None:
    cache, _, clock = make_cache(page_size=1)
    pinned = cache_tokens(cache, "ns", [1])  # oldest
    clock.now = 1.0
    cache_tokens(cache, "ns", [2])
    clock.now = 2.0
    cache_tokens(cache, "ns", [3])
    cache.bind_turn("turn-1", pinned, [])
    assert cache.pin("turn-1", ttl_s=100.0)
    assert not cache.pin("unknown-turn", ttl_s=100.0)
    assert cache.evict(1) == 1 and not is_cached(cache, "ns", [2])
    assert cache.evict(1) == 1 and not is_cached(cache, "ns", [3])
    assert cache.evict(1) == 1 and cache.lookup_turn("turn-1") is None
    cache.check_invariants()


def test_expired_or_removed_pin_behaves_as_unpinned() -> None:
    cache, _, clock = make_cache(page_size=1)
    node_a = cache_tokens(cache, "ns", [1])
    node_b = cache_tokens(cache, "ns", [2])
    cache.bind_turn("a", node_a, [])
    cache.bind_turn("b", node_b, [])
    assert cache.pin("a", ttl_s=5.0) and cache.pin("b", ttl_s=5.0)
    assert cache.unpin("b") and not cache.unpin("b")
    clock.now = 5.0  # still pinned at exactly the expiry
    assert cache.evict(1) == 1 and is_cached(cache, "ns", [1])
    cache_tokens(cache, "ns", [3])  # touched at t=5, after [1]
    clock.now = 6.0  # expired: [1] is plain LRU again
    assert cache.evict(1) == 1 and is_cached(cache, "ns", [3])
    cache.check_invariants()


def test_latest_pin_on_a_shared_node_wins() -> None:
    cache, _, clock = make_cache(page_size=1)
    node = cache_tokens(cache, "ns", [1])
    cache_tokens(cache, "ns", [2])
    cache.bind_turn("short", node, [])
    cache.bind_turn("long", node, [7])
    assert cache.pin("short", ttl_s=1.0) and cache.pin("long", ttl_s=10.0)
    clock.now = 5.0
    assert cache.evict(1) == 1 and is_cached(cache, "ns", [1])
    cache.check_invariants()


def test_lookup_turn_rebuilds_the_token_path_with_its_tail() -> None:
    cache, _, _ = make_cache(page_size=4)
    tokens = list(range(10))
    node = cache_tokens(cache, "ns", tokens)
    cache.bind_turn("turn-1", node, tokens[8:])
    cache.match_prefix("ns", [0, 1, 2, 3, 9, 9, 9, 9])  # splits the node under the turn
    ref = cache.lookup_turn("turn-1")
    assert ref is not None
    assert (ref.node, ref.namespace, ref.token_ids, ref.cached_len) == (node, "ns", tokens, 8)
    assert cache.lookup_turn("other") is None
    # A turn shorter than a page binds to the root, which is never evicted.
    root = cache.match_prefix("ns", [5]).node
    cache.bind_turn("short", root, [5])
    cache.reset()
    assert cache.lookup_turn("turn-1") is None
    short = cache.lookup_turn("short")
    assert short is not None and short.token_ids == [5] and short.cached_len == 0
    assert cache.unbind_turn("short") and cache.lookup_turn("short") is None
    cache.check_invariants()


def test_insert_rejects_wrong_page_count() -> None:
    cache, pool, _ = make_cache(page_size=2)
    with pytest.raises(ValueError):
        cache.insert("ns", [1, 2, 3], pool.alloc(2))
    assert cache.insert("ns", [1], []).num_new_pages == 0


def test_no_prefix_cache_holds_nothing() -> None:
    pool = PagePool(4)
    cache: PrefixCache = NoPrefixCache(pool, page_size=2)
    page_ids = pool.alloc(2)
    inserted = cache.insert("ns", [1, 2, 3, 4], page_ids)
    assert inserted.num_new_pages == 0
    match = cache.match_prefix("ns", [1, 2, 3, 4])
    assert match.page_ids == [] and match.cached_len == 0 and match.node == inserted.node
    cache.lock(match.node)
    cache.unlock(match.node)
    cache.bind_turn("turn", match.node, [])
    assert cache.lookup_turn("turn") is None and not cache.pin("turn", 1.0)
    assert cache.evict(4) == 0 and cache.num_cached_pages == 0
    pool.decref(page_ids)
    assert pool.num_free_pages == 4
    cache.check_invariants()


# ---------------------------------------------------------------------------------------------
# State machine
