"""How long a new request would wait here for its first token: the load shedder's estimate.

    wait = (prefill tokens ahead of it + its own) / prefill rate
         + two steps (its Extend arrives after the step that follows the probe, and its first
           token comes at the end of a step)
         + a slot's wait, when every running slot would still be taken: the longer of the
           measured interval between finishes times the requests queued for slots, and the
           steps until that many running requests reach their max_tokens

The prefill rate is measured, not configured: prompt tokens computed per second of step time,
as decayed sums over the steps that computed any (a busy engine's decode rows slow its prefill,
so it measures a lower rate); the step time is a decayed mean over every step. Tokens ahead
are the uncomputed prompt tokens of the waiting requests (less what the cache held for them
when they arrived), of the running requests still in prefill, and of *reservations*: a probe
that admits a turn (its estimate within the caller's bound) reserves the turn's tokens until
its Extend arrives (by the turn id it will bind) or `RESERVATION_S` pass. Probes answered
between two steps thus see each other's turns, as if those had already arrived. Until the
engine has measured a prefill step, the estimate is 0: a cold engine admits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.core import Request

DECAY = 0.9  # weight of the past per recorded step or finish (about the last 10 count)
RESERVATION_S = 3.0  # a probe's reservation lapses when no Extend follows within this


@dataclass
class QueueEstimator:
    """Mutable measurements of one engine; updated by its loop, read by its load probes."""

    prefill_tokens: float = 0.0  # decayed sums over steps that computed prompt tokens
    prefill_s: float = 0.0
    step_s: float = 0.0  # decayed mean duration of a step
    finish_interval_s: float = 0.0  # decayed mean time between two finished requests
    last_finish_s: float | None = None
    # Turns admitted by a probe whose Extend has not arrived: bind turn id -> (tokens, until).
    reserved: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    def record_step(self, num_prefill_tokens: int, step_s: float) -> None:
        """One step that computed `num_prefill_tokens` prompt tokens in `step_s` seconds."""
        if step_s <= 0:
            return
        self.step_s = step_s if self.step_s == 0 else DECAY * self.step_s + (1 - DECAY) * step_s
        if num_prefill_tokens <= 0:
            return
        self.prefill_tokens = DECAY * self.prefill_tokens + num_prefill_tokens
        self.prefill_s = DECAY * self.prefill_s + step_s

    def record_finish(self, now_s: float) -> None:
        if self.last_finish_s is not None:
            interval = max(0.0, now_s - self.last_finish_s)
            self.finish_interval_s = (interval if self.finish_interval_s == 0 else
                                      DECAY * self.finish_interval_s + (1 - DECAY) * interval)
        self.last_finish_s = now_s

    def admit(self, turn_id: str, num_tokens: int, wait_s: float, max_wait_s: float,
              now_s: float) -> None:
        """Reserve `num_tokens` for `turn_id` when its estimated `wait_s` is within
        `max_wait_s` (the caller will send it)."""
        if turn_id and wait_s <= max_wait_s:
            self.reserved[turn_id] = (max(1, num_tokens), now_s + RESERVATION_S)

    def arrived(self, turn_id: str | None, now_s: float) -> None:
        """A request binding `turn_id` was submitted: its reservation ends; lapsed ones go."""
        if turn_id:
            self.reserved.pop(turn_id, None)
        for lapsed in [t for t, (_, until) in self.reserved.items() if until < now_s]:
            del self.reserved[lapsed]

    def wait_s(self, waiting: Sequence[Request], running: Sequence[Request], max_running: int,
               num_new_tokens: int) -> float:
        """Seconds until a request with `num_new_tokens` uncached prompt tokens, queued now,
        would get its first token (0 before any measurement)."""
        rate = self.prefill_tokens_per_s
        if rate <= 0:
            return 0.0
        ahead = (sum(_prefill_left(r) for r in waiting)
                 + sum(_prefill_left(r) for r in running if r.first_token_s is None)
                 + sum(tokens for tokens, _ in self.reserved.values()))
        wait = (ahead + max(1, num_new_tokens)) / rate + 2 * self.step_s
        num_queued = (len(waiting) + len(self.reserved) + 1
                      - max(0, max_running - len(running)))
        if num_queued > 0 and running:
            wait += max(num_queued * self.finish_interval_s,
                        _slot_steps(num_queued, running, waiting) * self.step_s)
        return wait


def _slot_steps(num_queued: int, running: Sequence[Request], waiting: Sequence[Request]) -> int:
    """Steps until the `num_queued`-th running slot frees, if every running request used all of
    its max_tokens (an upper bound: drafts and early stops free slots sooner), and a request
    that takes a freed slot then holds it for the mean max_tokens of those queued."""
    left = sorted(max(1, r.params.max_tokens - len(r.output_ids)) for r in running)
    rounds, index = divmod(num_queued - 1, len(left))
    queued = waiting or running
    budget = sum(r.params.max_tokens for r in queued) // len(queued)
    return left[index] + rounds * budget


def prefill_rows(request: Request, start: int, num_rows: int) -> int:
    """How many of a step's `num_rows` rows from position `start` are prompt tokens."""
    return max(0, min(start + num_rows, len(request.prompt_ids)) - start)


def _prefill_left(request: Request) -> int:
    computed = max(request.num_computed, request.queued_cached_len)
    return max(0, len(request.prompt_ids) - computed)
