"""When to stop paying for drafts: a per-request exponential backoff over missed drafts.

A draft costs a lookup before the step and 1 + k verified rows in the forward; on text with
little to copy (prose) most drafts miss and that cost is pure loss. A miss is a draft with no
accepted token, or a lookup that found nothing. After `patience` misses in a row the request
skips drafting for the next 1, 2, 4 .. `max_skip` decode steps, one doubling per further miss;
the first accepted token resets it. Prose then pays for about one lookup every `max_skip`
steps, while the isolated misses of a copy with edits in it (an agent re-emitting a file with a
rename) skip nothing: skipping there lost 10% of the edit workload's speed in spec_decode.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftGateConfig:
    # Decode steps without drafting after a run of misses, at most. 0: draft on every step
    # (the reference path the tests compare with).
    max_skip: int = 16
    patience: int = 4  # misses in a row before any step is skipped


@dataclass
class _GateState:
    misses: int = 0  # misses in a row
    skip: int = 0  # the last backoff (0: none yet)
    left: int = 0  # decode steps still to skip


class DraftGate:
    """Per-request: `allow` before drafting, `observe` after a draft or an empty lookup,
    `forget` when the request ends."""

    def __init__(self, config: DraftGateConfig | None = None) -> None:
        self.config = config or DraftGateConfig()
        self._states: dict[str, _GateState] = {}
        self.num_skipped = 0  # decode steps on which a lookup was skipped

    def allow(self, request_id: str) -> bool:
        """Whether to look up a draft for this request on this step (counts a skipped one)."""
        state = self._states.get(request_id)
        if state is None or state.left == 0:
            return True
        state.left -= 1
        self.num_skipped += 1
        return False

    def observe(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """After a lookup: `num_drafted` 0 means it found nothing to propose."""
        if self.config.max_skip == 0:
            return
        state = self._states.setdefault(request_id, _GateState())
        if num_accepted > 0:
            state.misses = state.skip = state.left = 0
            return
        state.misses += 1
        if state.misses < self.config.patience:
            return
        state.skip = min(self.config.max_skip, max(1, state.skip * 2))
        state.left = state.skip

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def check_invariants(self) -> None:
        for state in self._states.values():
            assert 0 <= state.left <= state.skip <= self.config.max_skip
