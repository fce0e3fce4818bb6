"""Drafters propose tokens that the target model then verifies in one batched forward.

A drafter only guesses; correctness never depends on it (verification is exact), so a bad guess
costs compute, not quality. `propose` is called for each decoding request before a step,
`observe` after verification with how many of the proposed tokens were accepted, and `finish`
when a request ends (its tokens may feed later drafts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from engine.core import Request
    from engine.scheduler.scheduler import ScheduledItem


class Drafter(Protocol):
    name: str

    def propose(self, requests: list[Request], max_lens: list[int]) -> list[list[int]]:
        """Up to max_lens[i] draft tokens to follow requests[i].all_ids (possibly none)."""
        ...

    def observe(self, request: Request, num_drafted: int, num_accepted: int) -> None: ...

    def finish(self, request: Request) -> None: ...

    def check_invariants(self) -> None: ...


class DraftTree(NamedTuple):
    """A tree of draft tokens: token_ids[i] follows parents[i] (-1: the request's last token;
    else an earlier node), so every root-to-node path is one guess at the continuation."""

    token_ids: list[int]
    parents: list[int]


@runtime_checkable
class TreeDrafter(Protocol):
    """A drafter that may propose trees: several guesses verified in one forward under a tree
    attention mask (`engine.attention.tree`)."""

    @property
    def draws_trees(self) -> bool:
        """Whether `propose_trees` may return trees (else only chains)."""
        ...

    def propose_trees(self, requests: list[Request], max_lens: list[int]
                      ) -> list[DraftTree | list[int]]:
        """Per request a tree of at most max_lens[i] nodes, or a chain (a plain list)."""
        ...


@runtime_checkable
class FeatureDrafter(Protocol):
    """A drafter that reads the target's hidden states (EAGLE-3): the engine's forward captures
    the residual streams entering `capture_layers` and hands every scheduled row over."""

    capture_layers: Sequence[int]

    def record_features(self, items: Sequence[ScheduledItem], aux: torch.Tensor) -> None:
        """`aux`: (num scheduled rows, len(capture_layers) * hidden), in batch order."""
        ...

    def accept_rows(self, request: Request, start: int, rows: Sequence[int]) -> None:
        """After a tree verification at `start` (the position of the step's first row): the
        accepted nodes' rows, in path order, now hold positions start + 1, start + 2, ..."""
        ...


class AdaptiveLength:
    """Per-request draft length: grows while whole drafts are accepted, shrinks to what was
    accepted (plus one) after a rejection, so a miss costs few wasted positions."""

    def __init__(self, max_len: int, initial: int = 4) -> None:
        self.max_len = max_len
        self.initial = min(initial, max_len)

    def next_len(self, current: int | None, num_drafted: int, num_accepted: int) -> int:
        if current is None:
            return self.initial
        if num_drafted and num_accepted == num_drafted:
            return min(self.max_len, current + 2)
        return max(1, min(self.max_len, num_accepted + 1))
