"""Exact acceptance of a draft tree against the target model's logits.

A tree of n nodes: node i holds token_ids[i] and hangs under parents[i] (-1: under the root, the
last real token; else a node index < i). Rows of `logits`:

    row 0       the target's distribution after the root
    row i + 1   the distribution after the path root -> ... -> node i

Verification walks down from the root, one row per step, trying the current node's children in
node-index order:
- Greedy: take the row's argmax; move to the first child holding it, else emit it and stop.
- Sampling (drafts are deterministic, q = δ(token) per child; SpecInfer's / EAGLE's recursive
  rejection sampling): with p the row's filtered probabilities, accept a child with probability
  p(token); on rejection zero p(token), renormalise, and try the next child. If every child is
  rejected, sample the emitted token from the residual. A leaf's row gives a bonus token.
The emitted tokens have exactly the distribution of plain decoding, and a chain tree
(parents = [-1, 0, 1, ...]) gives what `verify_draft` gives, token, logprob and random draw alike.

With a grammar, each row on the accepted path is masked by the grammar's state after the path so
far; the grammar is rolled back before returning, so the caller advances it over the emitted
tokens exactly as in plain decoding.
"""

from __future__ import annotations

import torch

from engine.constrained.base import TokenGrammar
from engine.sampling import TokenChoice, filtered_probs, with_logprobs
from engine.sampling_params import SamplingParams
from engine.spec.verify import RowMasker

ROOT = -1  # parents[i] of a node directly under the root


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of each node: 1 for the root's children, parent's depth + 1 below.
    Raises ValueError if a parent is not in [-1, i)."""
    _check_parents(parents)
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent == ROOT else depths[parent] + 1)
    return depths


def verify_tree(logits: torch.Tensor, token_ids: list[int], parents: list[int],
                params: SamplingParams, generator: torch.Generator | None,
                grammar: TokenGrammar | None = None, mask: RowMasker | None = None
                ) -> tuple[list[TokenChoice], list[int]]:
    """Walk the draft tree from the root, accepting the nodes the target agrees with.

    logits: (len(token_ids) + 1, vocab) fp32, row layout in the module docstring; the rows a token
    is chosen at (the root's and each accepted node's) are masked in place when a grammar and
    `mask` are given, and no others. Returns (choices,
    path): `path` the accepted node indices from the root down, `choices` one per accepted node
    (its token, logprobs from the row it was chosen at) and then one corrected or bonus token from
    the row after the last accepted node, unless the grammar terminated inside the path. The
    grammar is left as it was, also when `mask` raises. Raises ValueError on inconsistent shapes
    or parents.
    """
    num_nodes = len(token_ids)
    if len(parents) != num_nodes:
        raise ValueError(f"{len(parents)} parents for {num_nodes} draft tokens")
    if logits.dim() != 2 or logits.shape[0] != num_nodes + 1:
        raise ValueError(f"logits must have shape ({num_nodes + 1}, vocab) for {num_nodes} "
                         f"draft tokens, got {tuple(logits.shape)}")
    _check_parents(parents)
    children: list[list[int]] = [[] for _ in range(num_nodes + 1)]  # by row: 0 root, i + 1 node i
    for child, parent in enumerate(parents):
        children[parent + 1].append(child)
    # Without a grammar no row changes, so one argmax call covers every row.
    targets = (torch.argmax(logits, dim=-1).tolist()
               if params.is_greedy and grammar is None else None)

    choices: list[TokenChoice] = []
    path: list[int] = []
    walked = 0  # grammar steps taken here, undone before returning
    row = 0
    try:
        while True:
            if grammar is not None and mask is not None:
                mask(logits[row : row + 1], grammar)
            if params.is_greedy:
                target = targets[row] if targets is not None else int(torch.argmax(logits[row]))
                node: int | None = next(
                    (c for c in children[row] if token_ids[c] == target), None)
                token_id = target
            else:
                node, token_id = _sample_children(logits[row], children[row], token_ids, params,
                                                  generator)
            choices.append(with_logprobs(logits[row], token_id, params))
            if node is None:
                return choices, path
            path.append(node)
            if grammar is not None:
                walked += grammar.accept_token(token_id)
                if grammar.is_terminated:  # a stop token inside the tree ends the output
                    return choices, path
            row = node + 1
    finally:
        if grammar is not None:
            grammar.rollback(walked)


def _sample_children(row: torch.Tensor, nodes: list[int], token_ids: list[int],
                     params: SamplingParams, generator: torch.Generator | None
                     ) -> tuple[int | None, int]:
    """Recursive rejection sampling at one row: (the accepted child or None, the emitted token).

    Keeping the residual normalised makes each test `rand < p(token)`, so a single child draws
    exactly what `verify_draft` draws, and no children (a leaf) exactly what `sample_row` draws.
    """
    probs = filtered_probs(row, params)  # a fresh tensor, safe to edit
    for node in nodes:
        token_id = token_ids[node]
        if float(torch.rand((), generator=generator)) < float(probs[token_id]):
            return node, token_id
        # Rejected: the draft proposed token_id with certainty, so the residual max(p - q, 0) is p
        # without it (a repeated sibling token already has p = 0 and is never accepted).
        probs[token_id] = 0.0
        probs = probs / probs.sum()
    return None, int(torch.multinomial(probs, 1, generator=generator))


def _check_parents(parents: list[int]) -> None:
    for node, parent in enumerate(parents):
        if not ROOT <= parent < node:
            raise ValueError(f"parent of node {node} must be in [-1, {node}), got {parent}")
