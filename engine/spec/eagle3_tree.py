"""EAGLE-3 tree drafts, grown as EAGLE-2 grows them: keep the most likely paths, not a fixed shape.

From a request's last extended position (the head's logits and hidden output there):

    depth 1     the head's `topk` most likely tokens, each scored by its log-probability;
    depth d+1   the `topk` best nodes of depth d (the frontier) are fed to the head in one
                batched pass, each attending to the request's head KV and to its own ancestors
                (a tree mask over the rows fed so far); each proposes `topk` children, scored
                by the path's summed log-probability;
    the tree    the `max_len` best-scored nodes of all depths. A child never scores above its
                parent, and ties go to the shallower node, so the chosen set holds every
                chosen node's ancestors; nodes are ordered by depth, parents first.

`steps` is the depth (steps - 1 head passes). The head KV rows the passes append are cut away
after, so the head's cache only ever holds positions of real tokens. A node of depth d is fed at
position seq_len - 2 + d, as in the chain (engine.spec.eagle3_drafter).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.spec.drafter import DraftTree
from engine.spec.eagle3_head import Eagle3Head, HeadKV


@dataclass(frozen=True)
class TreeShape:
    topk: int  # children per expanded node, and nodes expanded per depth
    steps: int  # the deepest node's depth

    def __post_init__(self) -> None:
        if self.topk < 1 or self.steps < 1:
            raise ValueError(f"a draft tree needs topk >= 1 and steps >= 1, got {self}")


@dataclass(frozen=True)
class TreeStart:
    """One request's head state where its tree grows from."""

    logits: torch.Tensor  # (draft_vocab,) at the last extended position
    hidden: torch.Tensor  # (hidden_size,) the head's output there
    kv: HeadKV
    seq_len: int


@dataclass(eq=False)
class _Node:
    token_id: int
    parent: int  # index in the request's node list, -1 for a depth-1 node
    depth: int
    score: float
    source: torch.Tensor  # the head output its logits came from: its input when fed
    kv_row: int = -1  # its row in the head KV once fed


def draft_trees(head: Eagle3Head, starts: list[TreeStart], max_lens: list[int],
                shape: TreeShape) -> list[DraftTree]:
    """One tree of at most max_lens[i] nodes per start (empty where max_lens[i] is 0).
    Leaves each start's KV as it found it."""
    kept = [start.kv.num_tokens for start in starts]
    trees: list[list[_Node]] = []
    frontiers: list[list[int]] = []
    for start, room in zip(starts, max_lens, strict=True):
        nodes: list[_Node] = []
        if room > 0:
            top = head.top_k(start.logits[None], min(shape.topk, room))
            for token_id, logprob in zip(top.token_ids[0].tolist(), top.logprobs[0].tolist(),
                                         strict=True):
                nodes.append(_Node(int(token_id), -1, 1, float(logprob), start.hidden))
        trees.append(nodes)
        frontiers.append(list(range(len(nodes))))
    try:
        for depth in range(1, shape.steps):
            live = [i for i, frontier in enumerate(frontiers) if frontier]
            if not live:
                break
            _expand(head, [starts[i] for i in live], [kept[i] for i in live],
                    [trees[i] for i in live], [frontiers[i] for i in live], depth, shape.topk)
            for i in live:
                children = [n for n, node in enumerate(trees[i]) if node.depth == depth + 1]
                children.sort(key=lambda n: -trees[i][n].score)
                frontiers[i] = children[: shape.topk]
    finally:
        for start, num_tokens in zip(starts, kept, strict=True):
            start.kv.truncate(num_tokens)  # draft rows are guesses, never kept
    return [_chosen(nodes, room) for nodes, room in zip(trees, max_lens, strict=True)]


def _expand(head: Eagle3Head, starts: list[TreeStart], prefix_lens: list[int],
            trees: list[list[_Node]], frontiers: list[list[int]], depth: int, topk: int) -> None:
    """Feed each tree's frontier (nodes of `depth`) to the head in one pass, each seeing the
    first prefix_lens[i] KV rows (real positions) and its ancestors; append each fed node's
    `topk` children."""
    tokens, hidden, positions, masks = [], [], [], []
    for start, prefix_len, nodes, frontier in zip(starts, prefix_lens, trees, frontiers,
                                                  strict=True):
        first_row = start.kv.num_tokens
        num_rows = first_row + len(frontier)
        mask = torch.zeros(len(frontier), num_rows, dtype=torch.bool)
        mask[:, :prefix_len] = True
        for row, n in enumerate(frontier):
            node = nodes[n]
            node.kv_row = first_row + row
            tokens.append(node.token_id)
            hidden.append(node.source)
            positions.append(start.seq_len - 2 + depth)
            ancestor = n
            while ancestor >= 0:
                mask[row, nodes[ancestor].kv_row] = True
                ancestor = nodes[ancestor].parent
        masks.append(mask)
    out = head.forward(torch.tensor(tokens, dtype=torch.long), torch.stack(hidden),
                       torch.tensor(positions, dtype=torch.long), [s.kv for s in starts],
                       [len(f) for f in frontiers], masks)
    top = head.top_k(out.logits, topk)
    row = 0
    for nodes, frontier in zip(trees, frontiers, strict=True):
        for n in frontier:
            parent = nodes[n]
            for token_id, logprob in zip(top.token_ids[row].tolist(),
                                         top.logprobs[row].tolist(), strict=True):
                nodes.append(_Node(int(token_id), n, depth + 1, parent.score + float(logprob),
                                   out.hidden[row]))
            row += 1


def _chosen(nodes: list[_Node], max_len: int) -> DraftTree:
    """The `max_len` best nodes (ancestors included, see the module docstring), parents
    first, as a DraftTree."""
    ranked = sorted(range(len(nodes)), key=lambda n: (-nodes[n].score, nodes[n].depth, n))
    chosen = sorted(ranked[:max_len], key=lambda n: (nodes[n].depth, n))
    index = {n: i for i, n in enumerate(chosen)}
    parents = []
    for n in chosen:
        parent = nodes[n].parent
        if parent >= 0 and parent not in index:
            raise AssertionError(f"draft tree node {n} chosen without its parent {parent}")
        parents.append(index[parent] if parent >= 0 else -1)
    return DraftTree([nodes[n].token_id for n in chosen], parents)
