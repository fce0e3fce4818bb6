"""The node of `engine.cache.radix_cache.RadixCache`'s trees."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class RadixNode:
    """One run of whole pages on a namespace's path. A root has no parent and no tokens.

    The object is the handle: a split keeps the deeper part's object, so a held node keeps
    meaning "the path ending here" (its depth_len, locks and turns stay valid).
    """

    node_id: int
    namespace: str
    parent: RadixNode | None = field(repr=False)
    token_ids: tuple[int, ...]  # a multiple of page_size tokens
    page_ids: list[int]  # one per page of token_ids
    depth_len: int  # tokens on the path root..self
    last_access: float
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict, repr=False)
    lock_ref: int = 0  # locks on this node or any descendant; > 0 protects root..self
    num_direct_locks: int = 0
    turn_ids: set[str] = field(default_factory=set)  # turns bound to this node
    is_removed: bool = False  # evicted: a stale handle must not be locked or bound
    # Sliding-window layers' pages, one per page of token_ids, NO_PAGE where given back (a
    # tombstone); None when the cache manages no sliding-window memory.
    swa_page_ids: list[int] | None = None


NO_PAGE = -1  # a sliding-window page given back: its KV is gone


def path_token_ids(node: RadixNode) -> list[int]:
    """The tokens on the path root..node."""
    runs: list[tuple[int, ...]] = []
    walk: RadixNode | None = node
    while walk is not None and walk.parent is not None:
        runs.append(walk.token_ids)
        walk = walk.parent
    return [t for run in reversed(runs) for t in run]


def path_nodes(node: RadixNode) -> list[RadixNode]:
    """The non-root nodes root..node, in path order."""
    nodes: list[RadixNode] = []
    walk: RadixNode | None = node
    while walk is not None and walk.parent is not None:
        nodes.append(walk)
        walk = walk.parent
    return nodes[::-1]


def path_page_ids(node: RadixNode) -> list[int]:
    """The page ids on the path root..node."""
    runs: list[list[int]] = []
    walk: RadixNode | None = node
    while walk is not None and walk.parent is not None:
        runs.append(walk.page_ids)
        walk = walk.parent
    return [p for run in reversed(runs) for p in run]
