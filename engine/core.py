"""Engine nouns: a request as the scheduler sees it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.sampling_params import SamplingParams
from engine.stopping import TextStopper

if TYPE_CHECKING:
    from engine.cache.base import CacheNode
    from engine.constrained.base import TokenGrammar


class Phase(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One generation. `all_ids` = prompt + output so far; the KV of `all_ids[:num_computed]`
    lives in `page_ids` (the request owns one reference on each page). A step extends the KV by
    some of `all_ids[num_computed:]`; when it reaches the end, a token is sampled and appended.
    After preemption the same rule recomputes prompt and output alike.

        [0, cached_len)             reused from the prefix cache at (the last) admission
        [cached_len, num_computed)  computed by this request
        [num_computed, len(all_ids)) still to compute (1 token while decoding)
    """

    request_id: str
    namespace: str
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    stopper: TextStopper
    generator: torch.Generator | None
    arrival_s: float
    bind_turn_id: str | None = None
    session_id: str | None = None
    shared_len: int = 0  # leading prompt tokens declared public (engine.scheduler.shared_prefix)
    grammar: TokenGrammar | None = None  # masks each sampled token; advanced with the output
    output_ids: list[int] = field(default_factory=list)
    page_ids: list[int] = field(default_factory=list)
    # Sliding-window layers' pages, parallel to page_ids (-1 where given back: out of every
    # query's window); empty when the engine manages no sliding-window memory.
    swa_page_ids: list[int] = field(default_factory=list)
    cached_len: int = 0
    first_cached_len: int | None = None  # cached_len at the first admission (what usage reports)
    queued_cached_len: int = 0  # what the cache held of the prompt on arrival (load estimates)
    num_computed: int = 0
    lock_node: CacheNode | None = None
    phase: Phase = Phase.WAITING
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_reason: str | None = None
    stop_token_id: int | None = None
    num_preemptions: int = 0
    draft_ids: list[int] = field(default_factory=list)  # proposed for this step; verified after
    # A tree draft: each draft token's parent (-1: the last real token), parents before
    # children. None: the draft is a chain.
    draft_parents: list[int] | None = None
    num_drafted: int = 0
    num_accepted: int = 0

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_remaining(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return self.seq_len - self.num_computed

    @property
    def is_decoding(self) -> bool:
        return self.num_remaining == 1 and bool(self.output_ids)
