"""Ref-counted bookkeeping for the KV page pool.

Page ids are plain ints in ``[0, num_pages)``; the KV tensors live in the model runner and are
indexed by these ids. Every holder owns one reference per page it holds: the radix tree owns one
on each page stored in its nodes, a running request owns one on each page in its page table. A
page goes back to the free list when its last reference is dropped.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from engine.errors import KVCacheExhausted


class PagePool:
    """Free list plus per-page reference counts. Pure bookkeeping: no tensors."""

    def __init__(self, num_pages: int) -> None:
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        # ref_counts[page_id] == 0 exactly for the pages in the free list.
        self._ref_counts = [0] * num_pages
        self._free_page_ids: deque[int] = deque(range(num_pages))

    @property
    def num_pages(self) -> int:
        return len(self._ref_counts)

    @property
    def num_free_pages(self) -> int:
        return len(self._free_page_ids)

    @property
    def num_used_pages(self) -> int:
        return self.num_pages - self.num_free_pages

    def ref_count(self, page_id: int) -> int:
        self._check_page_id(page_id)
        return self._ref_counts[page_id]

    def alloc(self, num_pages: int) -> list[int]:
        """Take `num_pages` pages from the free list, each with ref count 1.

        Raises `KVCacheExhausted` (allocating nothing) if fewer pages are free; the caller decides
        whether to evict cache or preempt and try again.
        """
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        if num_pages > len(self._free_page_ids):
            raise KVCacheExhausted(
                f"need {num_pages} KV pages, only {len(self._free_page_ids)} of "
                f"{self.num_pages} are free"
            )
        page_ids = [self._free_page_ids.popleft() for _ in range(num_pages)]
        for page_id in page_ids:
            self._ref_counts[page_id] = 1
        return page_ids

    def incref(self, page_ids: Iterable[int]) -> None:
        """Add one reference per listed page (a page listed twice gets two).

        Every page must be in use: a free page can only be obtained through `alloc`. Raises
        AssertionError without changing anything otherwise.
        """
        page_ids = list(page_ids)
        for page_id in page_ids:
            self._check_page_id(page_id)
            if self._ref_counts[page_id] == 0:
                raise AssertionError(f"incref of free page {page_id}")
        for page_id in page_ids:
            self._ref_counts[page_id] += 1

    def decref(self, page_ids: Iterable[int]) -> None:
        """Drop one reference per listed page; pages whose count reaches 0 return to the pool.

        Raises AssertionError without changing anything if a page would go below 0 (a double free
        is an ownership bug in the caller).
        """
        counts = Counter(page_ids)
        for page_id, count in counts.items():
            self._check_page_id(page_id)
            if self._ref_counts[page_id] < count:
                raise AssertionError(
                    f"decref of page {page_id} by {count} but its ref count is "
                    f"{self._ref_counts[page_id]}"
                )
        for page_id, count in counts.items():
            self._ref_counts[page_id] -= count
            if self._ref_counts[page_id] == 0:
                self._free_page_ids.append(page_id)

    def check_invariants(self) -> None:
        """Raise AssertionError if the free list and the ref counts disagree."""
        free = set(self._free_page_ids)
        if len(free) != len(self._free_page_ids):
            raise AssertionError("duplicate page id in the free list")
        num_used = 0
        for page_id, count in enumerate(self._ref_counts):
            if count < 0:
                raise AssertionError(f"page {page_id} has negative ref count {count}")
            if (count == 0) != (page_id in free):
                raise AssertionError(f"page {page_id}: ref count {count}, free={page_id in free}")
            num_used += count > 0
        if num_used + len(free) != self.num_pages:
            raise AssertionError(f"{num_used} used + {len(free)} free != {self.num_pages} pages")

    def _check_page_id(self, page_id: int) -> None:
        if not 0 <= page_id < len(self._ref_counts):
            raise IndexError(f"page id {page_id} out of range [0, {len(self._ref_counts)})")
