"""The gateway's telemetry: one `Telemetry` per app, and the wrapper that traces a turn.

`traced_turn` passes a turn's events through unchanged while it keeps the `chat {model}` span
(`observability.turn_spans`) and the per-turn Prometheus metrics up to date. The span starts
when the wrapper is first advanced (inside the handler, so under the HTTP server span) and ends
when `TurnEnded` passes, or when the stream fails or is closed early (client disconnect).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

from opentelemetry import trace

from gateway.errors import status_for
from gateway.turns import TurnEnded, TurnEvent, TurnStarted
from observability import ChatSpan, GatewayMetrics, TurnOutcome

TRACER_NAME = "radixgate.gateway"


@dataclass(frozen=True)
class Telemetry:
    """The tracer and metrics of one app (built in its lifespan)."""

    tracer: trace.Tracer
    metrics: GatewayMetrics

    @classmethod
    def create(cls, tracer_provider: trace.TracerProvider) -> Telemetry:
        return cls(tracer_provider.get_tracer(TRACER_NAME), GatewayMetrics())


def outcome_of(started: TurnStarted | None, ended: TurnEnded) -> TurnOutcome:
    """The plain-value record of a finished turn (zeros where the engine reported nothing)."""
    turn, done = ended.turn, ended.finished
    usage = turn.usage or {}
    timings = ended.timings
    return TurnOutcome(
        turn_id=turn.id, input_turn_id=turn.parent_id or "",
        parent_turn_id=started.parent_turn_id if started else "", branch=ended.branch,
        finish_reason=turn.finish_reason or (done.finish_reason if done else "stop"),
        input_tokens=int(usage.get("input_tokens", 0)),
        cached_tokens=int(usage.get("cached_tokens", 0)),
        computed_tokens=int(usage.get("computed_tokens", 0)),
        output_tokens=int(usage.get("output_tokens", 0)),
        queue_s=timings.queue_s if timings else 0.0,
        prefill_s=timings.prefill_s if timings else 0.0,
        decode_s=timings.decode_s if timings else 0.0,
        ttft_s=timings.ttft_s if timings else 0.0,
        finished_ns=ended.finished_ns or time.time_ns(),
        has_stop_token=done is not None and done.stop_token_id is not None,
        num_drafted=done.num_drafted if done else 0,
        num_accepted=done.num_accepted if done else 0)


async def traced_turn(telemetry: Telemetry, events: AsyncGenerator[TurnEvent, None], *,
                      model: str, session_id: str, max_tokens: int | None = None
                      ) -> AsyncGenerator[TurnEvent, None]:
    """`events`, unchanged. Closing this generator closes `events` (which aborts the engine
    request). Re-raises whatever `events` raises, after ending the span with that error."""
    chat = ChatSpan(telemetry.tracer, model, session_id, max_tokens=max_tokens)
    started: TurnStarted | None = None
    try:
        async with aclosing(events):
            async for event in events:
                if isinstance(event, TurnStarted):
                    started = event
                    chat.set_model(event.model or model)
                    chat.turn_started(event.input_turn_id, event.parent_turn_id)
                elif isinstance(event, TurnEnded):
                    outcome = outcome_of(started, event)
                    chat.finish(outcome)
                    telemetry.metrics.observe_turn(outcome)
                yield event
    except BaseException as exc:
        if not chat.is_ended:
            if isinstance(exc, Exception):
                error_type, reason = status_for(exc)[1], "error"
            else:  # closed early or cancelled: the client went away (or the server stops)
                error_type, reason = "client_disconnected", "abort"
            chat.fail(error_type, exc if isinstance(exc, Exception) else None)
            if started is not None:
                telemetry.metrics.observe_unfinished(reason)
        raise
    finally:
        if not chat.is_ended:  # exhausted without TurnEnded: a bug upstream, not a success
            chat.fail("incomplete")
