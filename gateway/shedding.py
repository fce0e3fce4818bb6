"""Load shedding: a turn that would wait longer than the bound for its first token is refused
at once (503 `overloaded`, Anthropic's 529, with `Retry-After`), instead of queueing without
limit behind work the engine cannot finish in time.

The estimate is the routed worker's own (`engine.scheduler.queue_estimate`: the prefill tokens
queued ahead of the turn and its own, at the prefill rate the worker measured, plus a wait for
a running slot). It needs the tokens the turn will compute there: the delta when the parent's KV
is bound on that worker, else the uncached part of the whole path (the engine matches it). With
several workers the router has already picked the least loaded of those near the best prefix;
a turn is shed when that worker is over the bound.

The estimate covers the engine and the turn's time in the gateway up to the probe, not what
follows (the Extend's trip, a gateway busy answering others, the first event's way back).
`Shedder` learns that part per worker: for each admitted turn it compares the predicted wait
with the first token's realised time at the gateway, and sheds on the prediction plus the
95th percentile of the recent shortfalls (`ShedMargin`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable

from engine.errors import EngineError
from engine.protocol import Finished
from gateway.engine_pool import Route
from gateway.errors import Overloaded

PROBE_TIMEOUT_S = 2.0
MARGIN_WINDOW = 200  # admitted turns remembered per worker
MARGIN_MIN_SAMPLES = 10  # fewer: no margin yet
MARGIN_QUANTILE = 0.95


class ShedMargin:
    """Per worker, how much later than predicted the first tokens of admitted turns came:
    the `MARGIN_QUANTILE` of the last `MARGIN_WINDOW` shortfalls (never below 0)."""

    def __init__(self) -> None:
        self._shortfalls: dict[str, deque[float]] = {}

    def observe(self, worker_id: str, predicted_s: float, realised_s: float) -> None:
        window = self._shortfalls.setdefault(worker_id, deque(maxlen=MARGIN_WINDOW))
        window.append(realised_s - predicted_s)

    def margin_s(self, worker_id: str) -> float:
        window = self._shortfalls.get(worker_id)
        if window is None or len(window) < MARGIN_MIN_SAMPLES:
            return 0.0
        ranked = sorted(window)
        return max(ranked[int(MARGIN_QUANTILE * (len(ranked) - 1))], 0.0)


class Shedder:
    """`check` before a turn's Extend, `observe` when its generation finished. Without a bound
    (`max_wait_s` None) nothing is probed or shed."""

    def __init__(self, max_wait_s: float | None) -> None:
        self.max_wait_s = max_wait_s
        self.margin = ShedMargin()

    async def check(self, route: Route, namespace: str, delta_len: int | None,
                    full_path: Callable[[], Awaitable[list[int]]], turn_id: str,
                    began_s: float) -> float | None:
        """`check_queue` with the worker's margin; returns the predicted wait (seconds from
        `began_s` to the first token), None when not judged."""
        if self.max_wait_s is None:
            return None
        return await check_queue(route, namespace, delta_len, full_path, self.max_wait_s,
                                 turn_id, began_s,
                                 margin_s=self.margin.margin_s(route.link.worker_id))

    def observe(self, route: Route, predicted_s: float | None, began_s: float,
                done: Finished) -> None:
        """Learn from an admitted turn: its first token reached the gateway about `decode_s`
        before its result did."""
        if predicted_s is None or done.output_len == 0:
            return
        realised_s = time.monotonic() - began_s - done.timings.decode_s
        self.margin.observe(route.link.worker_id, predicted_s, realised_s)


async def check_queue(route: Route, namespace: str, delta_len: int | None,
                      full_path: Callable[[], Awaitable[list[int]]], max_wait_s: float,
                      turn_id: str, began_s: float, *, margin_s: float = 0.0) -> float | None:
    """Raise Overloaded when `route`'s worker estimates the turn's first token further off than
    `max_wait_s`, counting the time since the turn began here (`began_s`, time.monotonic():
    the store's round trips, and the probe's, which waits for the worker's current step) and
    `margin_s` (what the estimate has been missing, `ShedMargin`). Returns the predicted wait
    without the margin (None: the worker did not answer).
    `delta_len`: the tokens to compute when the parent is bound there (None: unbound, the path
    is matched). `turn_id`: the reply turn the Extend will bind; the worker reserves the turn's
    tokens until it arrives, so turns probed together see each other. A worker that does not
    answer the probe is not judged here (the turn's own request meets its failure)."""
    bound_s = max(max_wait_s - margin_s, 0.0)  # what the worker may reserve against
    try:
        if delta_len is not None:
            match = await route.link.client.probe(namespace, [], timeout_s=PROBE_TIMEOUT_S,
                                                  num_new_tokens=delta_len,
                                                  max_wait_s=bound_s, reserve_for=turn_id)
        else:
            match = await route.link.client.probe(namespace, await full_path(),
                                                  timeout_s=PROBE_TIMEOUT_S,
                                                  max_wait_s=bound_s, reserve_for=turn_id)
    except (EngineError, TimeoutError):
        return None
    predicted_s = match.queue_wait_s + (time.monotonic() - began_s)
    wait_s = predicted_s + margin_s
    if wait_s > max_wait_s:
        raise Overloaded(
            f"the engine is overloaded: this turn would wait about {wait_s:.1f} s for its "
            f"first token (the bound is {max_wait_s:g} s, --max-queue-wait); retry later",
            retry_after_s=wait_s - max_wait_s)
    return predicted_s
