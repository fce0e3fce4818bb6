"""Drafts checked against a request's grammar before they are verified.

Verification masks the rows on the accepted path, so output stays valid whatever was drafted;
a draft token the grammar forbids can never be accepted, and it and everything drafted after
it only cost verify rows. `prune_draft` walks the tree depth-first through the grammar (accept
on the way down, roll back on the way up) and keeps the nodes whose whole path it allows. A
chain is the tree where each node is the child of the one before, so it is cut at its first
forbidden token.
"""

from __future__ import annotations

from engine.constrained.base import TokenGrammar


def prune_draft(grammar: TokenGrammar, token_ids: list[int], parents: list[int]
                ) -> tuple[list[int], list[int]]:
    """The nodes of the tree (token_ids[i] after parents[i], -1: the request's last token;
    parents before children) whose path the grammar allows from its current state, in their
    order, with their parents renumbered. The grammar's state is unchanged on return."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    kept: list[int] = []
    # (node, entering): entering a node accepts its token; leaving it rolls the token back.
    stack: list[tuple[int, bool]] = [(node, True) for node in reversed(children.get(-1, []))]
    walked = 0
    try:
        while stack:
            node, entering = stack.pop()
            if not entering:
                grammar.rollback(1)
                walked -= 1
                continue
            if not grammar.accept_token(token_ids[node]):
                continue  # forbidden: the node and its subtree go
            walked += 1
            kept.append(node)
            stack.append((node, False))
            if not grammar.is_terminated:  # nothing follows a stop token
                stack.extend((child, True) for child in reversed(children.get(node, [])))
    finally:
        if walked:
            grammar.rollback(walked)
    kept.sort()
    index = {node: i for i, node in enumerate(kept)}
    return ([token_ids[node] for node in kept],
            [index[parents[node]] if parents[node] >= 0 else -1 for node in kept])
