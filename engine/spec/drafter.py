"""Drafters propose tokens that the target model then verifies in one batched forward.

A drafter only guesses; correctness never depends on it (verification is exact), so a bad guess
costs compute, not quality. `propose` is called for each decoding request before a step,
`observe` after verification with how many of the proposed tokens were accepted, and `finish`
when a request ends (its tokens may feed later drafts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

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


@runtime_checkable
class FeatureDrafter(Protocol):
    """A drafter that reads the target's hidden states (EAGLE-3): the engine's forward captures
    the residual streams entering `capture_layers` and hands every scheduled row over."""

    capture_layers: Sequence[int]

    def record_features(self, items: Sequence[ScheduledItem], aux: torch.Tensor) -> None:
        """`aux`: (num scheduled rows, len(capture_layers) * hidden), in batch order."""
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
