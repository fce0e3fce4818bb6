"""The structure under `engine.cache.radix_cache.RadixCache`: per-namespace trees of token-id
runs at page granularity, with walks that split nodes at a match boundary, lock counts, and the
structural invariants. Policy (what to evict, turns, pins, sliding-window pages) is the
subclass's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from engine.cache.base import CacheNode
from engine.cache.page_pool import PagePool
from engine.cache.radix_node import RadixNode


class RadixTree:
    """Nodes, the leaf set, and page counts (cached, locked). The tree owns one pool
    reference per page in its nodes."""

    def __init__(self, page_pool: PagePool, page_size: int, clock: Callable[[], float]) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_pool: Final = page_pool
        self.page_size: Final = page_size
        self._clock = clock
        self._next_node_id = 0
        self._roots: dict[str, RadixNode] = {}
        self._leaves: set[RadixNode] = set()  # non-root nodes without children
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

    def cached_prefix_len(self, namespace: str, token_ids: Sequence[int]) -> int:
        ps = self.page_size
        node, pos = self._roots.get(namespace), 0
        end = len(token_ids) // ps * ps
        while node is not None and pos < end:
            child = node.children.get(tuple(token_ids[pos : pos + ps]))
            if child is None:
                break
            num_common = self._common_len(child, token_ids, pos, end)
            pos += num_common // ps * ps
            node = child if num_common == len(child.token_ids) else None
        return pos

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

    def _root(self, namespace: str) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            self._next_node_id += 1
            root = RadixNode(self._next_node_id, namespace, None, (), [], 0, self._clock())
            self._roots[namespace] = root
        return root

    def _new_node(self, parent: RadixNode, run: tuple[int, ...], page_ids: list[int],
                  swa_page_ids: list[int] | None = None) -> RadixNode:
        self._next_node_id += 1
        depth, t = parent.depth_len + len(run), parent.last_access
        node = RadixNode(self._next_node_id, parent.namespace, parent, run, page_ids, depth, t)
        node.swa_page_ids = swa_page_ids
        return node

    def _descendants(self, root: RadixNode) -> list[RadixNode]:
        out, stack = [], list(root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _own(self, node: CacheNode) -> RadixNode:
        if not isinstance(node, RadixNode) or node.is_removed:
            raise ValueError(f"not a live RadixNode (evicted or foreign): {node!r}")
        return node

    def _walk(self, namespace: str,
              token_ids: Sequence[int]) -> tuple[RadixNode, list[int], list[int]]:
        """Follow the longest cached whole-page prefix, splitting at its end; touch the path.
        Returns its end, page ids and sliding-window page ids (empty without them)."""
        ps = self.page_size
        end = len(token_ids) // ps * ps
        now = self._clock()
        node = self._root(namespace)
        node.last_access = now
        page_ids: list[int] = []
        swa_ids: list[int] = []
        while len(page_ids) * ps < end:
            pos = len(page_ids) * ps
            child = node.children.get(tuple(token_ids[pos : pos + ps]))
            if child is None:
                break
            num_common = self._common_len(child, token_ids, pos, end)
            is_partial = num_common < len(child.token_ids)
            if is_partial:
                child = self._split(child, num_common // ps)
            child.last_access = now
            page_ids.extend(child.page_ids)
            swa_ids.extend(child.swa_page_ids or ())
            node = child
            if is_partial:
                break
        return node, page_ids, swa_ids

    def _common_len(self, child: RadixNode, token_ids: Sequence[int], pos: int,
                    end: int) -> int:
        """How many tokens of `child`'s run equal token_ids[pos:end] from their start; `child`
        was found by its first page, so that page matches."""
        limit = min(len(child.token_ids), end - pos)
        num_common = self.page_size
        while num_common < limit and child.token_ids[num_common] == token_ids[pos + num_common]:
            num_common += 1
        return num_common

    def _split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut `node` after `num_pages` pages; return the new upper part. The lower part keeps the
        object (its locks, turns, depth), so a handle keeps meaning "the path ending here"."""
        ps = self.page_size
        parent = node.parent
        assert parent is not None and 0 < num_pages < len(node.page_ids)
        cut = num_pages * ps
        swa = node.swa_page_ids
        upper = self._new_node(parent, node.token_ids[:cut], node.page_ids[:num_pages],
                               None if swa is None else swa[:num_pages])
        node.swa_page_ids = None if swa is None else swa[num_pages:]
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

    def _check_tree(self, check_node: Callable[[RadixNode, str], None]) -> set[RadixNode]:
        """Raise AssertionError for a broken structure; returns every node (roots included).
        Calls `check_node(node, where)` on each non-root node for the subclass's checks."""
        self.page_pool.check_invariants()
        ps = self.page_size
        nodes: set[RadixNode] = set()
        # page -> (position, tokens, namespaces): one node per tree, the same place in each
        page_places: dict[int, tuple[int, tuple[int, ...], set[str]]] = {}
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
                check_node(node, where)
                start = node.depth_len - len(node.token_ids)
                for i, page_id in enumerate(node.page_ids):
                    place = (start + i * ps, node.token_ids[i * ps : (i + 1) * ps])
                    seen = page_places.setdefault(page_id, (*place, set()))
                    assert namespace not in seen[2], f"{where}: page {page_id} twice in a tree"
                    assert seen[:2] == place, f"{where}: page {page_id} shared at another place"
                    seen[2].add(namespace)
        num_refs = 0
        for page_id, (_, _, namespaces) in page_places.items():
            num_refs += len(namespaces)
            assert self.page_pool.ref_count(page_id) >= len(namespaces), f"page {page_id} freed"
        assert num_refs == self._num_cached_pages, f"cached {self._num_cached_pages}"
        assert num_locked == self._num_locked_pages, f"locked {self._num_locked_pages}"
        leaves = {node for node in nodes if node.parent is not None and not node.children}
        assert leaves == self._leaves, "leaf set out of date"
        return nodes
