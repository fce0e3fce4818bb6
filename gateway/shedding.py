"""Load shedding: a turn that would wait longer than the bound for its first token is refused
at once (503 `overloaded`, Anthropic's 529, with `Retry-After`), instead of queueing without
limit behind work the engine cannot finish in time.

The estimate is the routed worker's own (`engine.scheduler.queue_estimate`: the prefill tokens
queued ahead of the turn and its own, at the prefill rate the worker measured, plus a wait for
a running slot). It needs the tokens the turn will compute there: the delta when the parent's KV
is bound on that worker, else the uncached part of the whole path (the engine matches it). With
several workers the router has already picked the least loaded of those near the best prefix;
a turn is shed when that worker is over the bound.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from engine.errors import EngineError
from gateway.engine_pool import Route
from gateway.errors import Overloaded

PROBE_TIMEOUT_S = 2.0


async def check_queue(route: Route, namespace: str, delta_len: int | None,
                      full_path: Callable[[], Awaitable[list[int]]], max_wait_s: float,
                      turn_id: str, began_s: float) -> None:
    """Raise Overloaded when `route`'s worker estimates the turn's first token further off than
    `max_wait_s`, counting the time since the turn began here (`began_s`, time.monotonic():
    the store's round trips, and the probe's, which waits for the worker's current step).
    `delta_len`: the tokens to compute when the parent is bound there (None: unbound, the path
    is matched). `turn_id`: the reply turn the Extend will bind; the worker reserves the turn's
    tokens until it arrives, so turns probed together see each other. A worker that does not
    answer the probe is not judged here (the turn's own request meets its failure)."""
    try:
        if delta_len is not None:
            match = await route.link.client.probe(namespace, [], timeout_s=PROBE_TIMEOUT_S,
                                                  num_new_tokens=delta_len,
                                                  max_wait_s=max_wait_s, reserve_for=turn_id)
        else:
            match = await route.link.client.probe(namespace, await full_path(),
                                                  timeout_s=PROBE_TIMEOUT_S,
                                                  max_wait_s=max_wait_s, reserve_for=turn_id)
    except (EngineError, TimeoutError):
        return
    wait_s = match.queue_wait_s + (time.monotonic() - began_s)
    if wait_s > max_wait_s:
        raise Overloaded(
            f"the engine is overloaded: this turn would wait about {wait_s:.1f} s for its "
            f"first token (the bound is {max_wait_s:g} s, --max-queue-wait); retry later",
            retry_after_s=wait_s - max_wait_s)
