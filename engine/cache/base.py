"""The prefix-cache interface the scheduler programs against, and its result types.

Two implementations: `RadixCache` (the radix tree) and `NoPrefixCache` (the null object behind
``--no-prefix-cache``). Keys are token-id sequences at page granularity: only whole pages are ever
cached, so a sequence of length L contributes ``L // page_size`` pages. Every operation takes a
``namespace`` (an opaque string: the gateway derives it from model, tenant and salt); namespaces
never share nodes. They share pages only where a tenant's tree was seeded from the public
namespace's (`PUBLIC_NAMESPACE`, an operator-declared prefix; `engine.scheduler.shared_prefix`):
such a page sits at the same position, under the same tokens, in each tree that holds it, and
each of those trees holds its own pool reference on it.

Ownership: the cache owns one pool reference on each page stored in it. Pages returned by
`match_prefix` are the cache's; a request that keeps them increfs them itself (and locks the node
so they cannot be evicted meanwhile).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from engine.cache.page_pool import PagePool

# The tree of the operator's declared public prefix; no request runs in it (the engine refuses it
# as a request's namespace), requests only graft from it and publish to it.
PUBLIC_NAMESPACE = "\x00public"


class CacheNode(Protocol):
    """Opaque handle on a cached path: "the path from the namespace root to this node".

    A handle keeps that meaning across node splits. It is only safe to use while locked: an
    unlocked node may be evicted, after which `lock` and `bind_turn` reject it.
    """

    @property
    def node_id(self) -> int: ...

    @property
    def namespace(self) -> str: ...


class MatchResult(NamedTuple):
    node: CacheNode  # end of the matched path (the namespace root when nothing matched)
    page_ids: list[int]  # one per cached page of the prefix, in order; owned by the cache
    cached_len: int  # len(page_ids) * page_size tokens
    # The sliding-window layers' pages of the prefix (NO_PAGE where given back), parallel to
    # page_ids; empty when the cache manages no sliding-window memory.
    swa_page_ids: list[int] = []


@dataclass(frozen=True)
class SlidingWindow:
    """The sliding-window layers' page pool and window, for a cache and a scheduler that give
    those layers' pages back once no query can see them."""

    pool: PagePool
    window: int  # tokens: a query at position p sees keys at p - window < j <= p

    def first_needed_page(self, next_pos: int, page_size: int) -> int:
        """The first page a query at `next_pos` (or later) can read."""
        return max(0, next_pos - self.window + 1) // page_size


class InsertResult(NamedTuple):
    node: CacheNode  # end of the inserted full-page path (the namespace root for zero pages)
    num_new_pages: int  # caller pages the cache adopted (and incref'd)


class TurnRef(NamedTuple):
    node: CacheNode  # end of the turn's cached path
    namespace: str
    token_ids: list[int]  # the turn's full token path: cached path + uncached tail
    cached_len: int  # tokens on the cached path (the node's depth)


class PrefixCache(Protocol):
    """What the scheduler needs from a prefix cache."""

    @property
    def page_pool(self) -> PagePool: ...

    @property
    def page_size(self) -> int: ...

    @property
    def num_cached_pages(self) -> int:
        """Page references the cache holds: a page seeded into several namespaces' trees
        (a shared public prefix) counts once per tree."""
        ...

    @property
    def num_evictable_pages(self) -> int:
        """Cached pages on unlocked nodes; `num_evictable_pages + num_locked_pages` is cached."""
        ...

    @property
    def num_locked_pages(self) -> int: ...

    @property
    def num_pins(self) -> int:
        """Turns pinned now (expired pins included until they are swept)."""
        ...

    def match_prefix(self, namespace: str, token_ids: Sequence[int]) -> MatchResult:
        """Longest cached prefix of `token_ids` in whole pages. With sliding-window memory, the
        longest one whose last window of sliding-layer pages is still held (a query right after
        it reads only that window): a prefix past a given-back window is not a hit.

        Mutates only structure and recency: may split a node at the match boundary (existing
        handles keep their meaning) and marks the path as recently used. Changes no ref counts
        and no locks.
        """
        ...

    def cached_prefix_len(self, namespace: str, token_ids: Sequence[int]) -> int:
        """Tokens of `token_ids`' longest cached whole-page prefix. Changes nothing (a probe,
        not a use: no split, no recency)."""
        ...

    def insert(
        self, namespace: str, token_ids: Sequence[int], page_ids: Sequence[int],
        swa_page_ids: Sequence[int] | None = None,
    ) -> InsertResult:
        """Cache the full pages of `token_ids`, whose KV is in `page_ids` (one per full page)
        and, with sliding-window memory, `swa_page_ids` (parallel; NO_PAGE where the caller gave
        a page back).

        Pages of the path the cache did not hold are adopted: the cache increfs the caller's
        page; so are sliding-window pages where the cached path had given its own back. Pages
        already cached are left alone, so the caller's duplicates are freed when it decrefs its
        own pages. Raises ValueError if `len(page_ids) != len(token_ids) // page_size`.
        """
        ...

    def lock(self, node: CacheNode) -> None:
        """Protect the path root..node from eviction until a matching `unlock`."""
        ...

    def unlock(self, node: CacheNode) -> None:
        """Undo one `lock(node)`. Raises AssertionError if `node` holds no lock."""
        ...

    def evict(self, num_pages: int) -> int:
        """Drop the cache's reference on at least `num_pages` pages if possible.

        Removes unlocked leaves, least recently used first; leaves pinned by a live pin go last.
        Returns the number of pages dropped (may exceed `num_pages`: whole nodes go). A dropped
        page returns to the pool only if no request holds it. `evict(0)` does nothing.
        """
        ...

    def evict_swa(self, num_pages: int) -> int:
        """Give back at least `num_pages` sliding-window pages if possible: those of inner nodes
        first (least recently used first, pinned last), then whole leaves. Only pages no request
        holds count; a prefix that loses its last window stops matching (`match_prefix`).
        Returns the number of sliding-window pages freed. 0 without sliding-window memory."""
        ...

    def bind_turn(self, turn_id: str, node: CacheNode, tail_token_ids: Sequence[int]) -> None:
        """Record that `turn_id`'s token path is (path to `node`) + `tail_token_ids`.

        Rebinding a turn moves it (and its pin). The binding is dropped when `node` is evicted.
        """
        ...

    def lookup_turn(self, turn_id: str) -> TurnRef | None:
        """The turn's path, or None if it is unknown or its node was evicted."""
        ...

    def unbind_turn(self, turn_id: str) -> bool:
        """Forget a turn and its pin. Returns whether it was bound."""
        ...

    def pin(self, turn_id: str, ttl_s: float) -> bool:
        """Evict the turn's node last until ``clock() > now + ttl_s``.

        Re-pinning a turn replaces its expiry; among several turns on one node the latest
        expiry wins. Returns False (pinning nothing) if the turn is not bound.
        """
        ...

    def unpin(self, turn_id: str) -> bool:
        """Remove the turn's pin. Returns whether it had one."""
        ...

    def reset(self) -> None:
        """Drop every unlocked node, pinned or not (a cold cache for tests and benchmarks)."""
        ...

    def check_invariants(self) -> None:
        """Raise AssertionError describing the first broken invariant, if any."""
        ...
