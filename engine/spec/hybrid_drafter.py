"""The trajectory drafter and an EAGLE-3 head together: per request and step, the suffix drafter's
proposal where it continues a long match (text the agent re-emits: file content, JSON it has
seen, paths), the head's everywhere else (new prose, where the suffix drafter has nothing).

The head runs only for the requests it drafts for: the others' captured features wait, and it
catches up over them in one pass when it drafts again (engine.spec.eagle3_drafter). `observe`
reaches the drafter whose draft was verified: the suffix drafter adapts its draft length to its
own hits. The head drafts only while its drafts pay (`HeadWorth`), so with a head that guesses
badly the combination falls back to the suffix drafter alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.spec.drafter import DraftTree
from engine.spec.eagle3_drafter import Eagle3Drafter
from engine.spec.gate import DraftGate, DraftGateConfig
from engine.spec.suffix_drafter import SuffixDrafter

if TYPE_CHECKING:
    import torch

    from engine.core import Request
    from engine.scheduler.scheduler import ScheduledItem

# A match of at least this many tokens is re-emitted text: the suffix drafter's long drafts are
# then mostly accepted, where a head's acceptance falls with each step.
DEFAULT_MIN_MATCH_LEN = 4


@dataclass
class HeadWorth:
    """Whether the head's drafts have paid lately, over all requests: an exponential average of
    the tokens accepted per head draft. Below `min_accepted` the head drafts only as a probe,
    once every `probe_every` chances, so a head that does not pay costs almost nothing (a request
    the head never drafts for never runs it) while one that starts paying is noticed. One token
    a draft: a draft token costs a head pass, a third of a target decode step for SmolLM2's head
    on the CPU (benchmarks.spec_heads), and the verify rows are not free either."""

    min_accepted: float = 1.0
    probe_every: int = 64
    decay: float = 0.05
    value: float = 2.0  # optimistic: a new head drafts until it has shown what it is worth
    chances: int = 0

    def allow(self) -> bool:
        """Whether the head may draft at one chance (a request it would draft for)."""
        if self.value >= self.min_accepted:
            return True
        self.chances += 1
        return self.chances % self.probe_every == 0

    def observe(self, num_accepted: int) -> None:
        self.value += self.decay * (num_accepted - self.value)


class HybridDrafter:
    name = "eagle3+suffix"

    # The speculator's own gate would let the head's misses stop the suffix drafter's
    # drafts too: this drafter gates the head alone, and a long match is always drafted.
    gates_itself = True

    def __init__(self, suffix: SuffixDrafter, eagle: Eagle3Drafter,
                 min_match_len: int = DEFAULT_MIN_MATCH_LEN,
                 gate: DraftGateConfig | None = None) -> None:
        self.suffix = suffix
        self.eagle = eagle
        self.min_match_len = min_match_len
        self.head_gate = DraftGate(gate)
        self.worth = HeadWorth()
        self.capture_layers = eagle.capture_layers
        self._from_suffix: dict[str, bool] = {}  # which drafter made a request's last draft
        self.num_suffix_drafts = 0
        self.num_head_drafts = 0

    def record_features(self, items: Sequence[ScheduledItem], aux: torch.Tensor) -> None:
        self.eagle.record_features(items, aux)

    @property
    def draws_trees(self) -> bool:
        return self.eagle.draws_trees

    def accept_rows(self, request: Request, start: int, rows: Sequence[int]) -> None:
        self.eagle.accept_rows(request, start, rows)

    def propose(self, requests: list[Request], max_lens: list[int]) -> list[list[int]]:
        return [d if isinstance(d, list) else d.token_ids  # no trees without a shape
                for d in self._propose(requests, max_lens, trees=False)]

    def propose_trees(self, requests: list[Request], max_lens: list[int]
                      ) -> list[DraftTree | list[int]]:
        """The suffix drafter's chain where it matched long, else the head's tree."""
        return self._propose(requests, max_lens, trees=True)

    def _propose(self, requests: list[Request], max_lens: list[int], trees: bool
                 ) -> list[DraftTree | list[int]]:
        matched = self.suffix.propose_matched(requests, max_lens)
        use_suffix = [n >= self.min_match_len and bool(tokens) for n, tokens in matched]
        rooms = [0 if taken or not self.head_gate.allow(req.request_id)
                 or not self.worth.allow() else room
                 for req, taken, room in zip(requests, use_suffix, max_lens, strict=True)]
        head: list[DraftTree | list[int]] = (self.eagle.propose_trees(requests, rooms) if trees
                                             else list(self.eagle.propose(requests, rooms)))
        drafts: list[DraftTree | list[int]] = []
        for req, taken, (_, tokens), guess in zip(requests, use_suffix, matched, head,
                                                  strict=True):
            self._from_suffix[req.request_id] = taken
            drafts.append(tokens if taken else guess)
            self.num_suffix_drafts += taken and bool(tokens)
            self.num_head_drafts += (not taken) and bool(
                guess if isinstance(guess, list) else guess.token_ids)
        return drafts

    def observe(self, request: Request, num_drafted: int, num_accepted: int) -> None:
        if self._from_suffix.get(request.request_id):
            self.suffix.observe(request, num_drafted, num_accepted)
        else:
            self.eagle.observe(request, num_drafted, num_accepted)
            self.head_gate.observe(request.request_id, num_drafted, num_accepted)
            if num_drafted:
                self.worth.observe(num_accepted)

    def finish(self, request: Request) -> None:
        self._from_suffix.pop(request.request_id, None)
        self.head_gate.forget(request.request_id)
        self.suffix.finish(request)
        self.eagle.finish(request)

    def check_invariants(self) -> None:
        self.head_gate.check_invariants()
        self.suffix.check_invariants()
        self.eagle.check_invariants()
