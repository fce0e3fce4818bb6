"""Sliding-window pages in the radix tree (SGLang's SWA tombstones, at page granularity).

A node holds one sliding-layer page per page of its tokens, or NO_PAGE where it was given back.
A cached prefix is usable only if the pages its last window needs are all held: a query right
after it reads nothing older. These helpers are the tree-side rules; `RadixCache` calls them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from engine.cache.base import SlidingWindow
from engine.cache.page_pool import PagePool
from engine.cache.radix_node import NO_PAGE, RadixNode, path_nodes


def usable_pages(swa_page_ids: Sequence[int], swa: SlidingWindow, page_size: int) -> int:
    """The most pages n <= len(swa_page_ids) of a path such that a query at position
    n * page_size finds every sliding-window page it reads held."""
    last_gap = -1  # index of the latest given-back page below n
    best = 0
    for n in range(1, len(swa_page_ids) + 1):
        if swa_page_ids[n - 1] == NO_PAGE:
            last_gap = n - 1
        if last_gap < swa.first_needed_page(n * page_size, page_size):
            best = n
    return best


def adopt_into_path(end: RadixNode, swa_page_ids: Sequence[int], pool: PagePool) -> int:
    """Fill the given-back sliding-window pages of the path root..end with the caller's held
    ones at the same positions (increfs them). Returns the number adopted."""
    adopted = 0
    pos = 0
    for node in path_nodes(end):
        ids = node.swa_page_ids
        assert ids is not None
        for i in range(len(ids)):
            if ids[i] == NO_PAGE and pos + i < len(swa_page_ids) and swa_page_ids[pos + i] >= 0:
                ids[i] = swa_page_ids[pos + i]
                pool.incref([ids[i]])
                adopted += 1
        pos += len(ids)
    return adopted


def live(ids: Iterable[int]) -> list[int]:
    return [p for p in ids if p != NO_PAGE]


def give_back_inner(nodes: Iterable[RadixNode], num_pages: int, pool: PagePool,
                    key: Callable[[RadixNode], tuple[bool, float, int]]) -> int:
    """Give back the sliding-window pages only the tree holds on `nodes` (inner nodes),
    least by `key` first, until `num_pages` are free. Returns the number freed."""
    freed = 0
    for node in sorted(nodes, key=key):
        if freed >= num_pages:
            break
        ids = node.swa_page_ids
        assert ids is not None
        for i, page in enumerate(ids):
            # A page a running request also holds would not be freed: keep it in the tree.
            if page != NO_PAGE and pool.ref_count(page) == 1:
                pool.decref([page])
                ids[i] = NO_PAGE
                freed += 1
    return freed


def check_node(node: RadixNode, pool: PagePool, seen: set[int], where: str) -> int:
    """Raise AssertionError for a broken node; returns its held sliding-window pages."""
    ids = node.swa_page_ids
    assert ids is not None and len(ids) == len(node.page_ids), f"{where}: swa pages per page"
    held = live(ids)
    for page in held:
        assert page not in seen, f"{where}: sliding-window page {page} in two nodes"
        assert pool.ref_count(page) >= 1, f"{where}: freed sliding-window page {page}"
        seen.add(page)
    return len(held)

