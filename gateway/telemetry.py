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
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from gateway.errors import status_for
from gateway.live_turns import LiveTurns
from gateway.toolcall_parser import ToolCallDelta, ToolCallStart
from gateway.turns import TextDelta, TurnEnded, TurnEvent, TurnStarted
from observability import ChatSpan, GatewayMetrics, TurnOutcome
from observability.turn_history import TurnHistory, TurnRecord

TRACER_NAME = "radixgate.gateway"


@dataclass(frozen=True)
class Telemetry:
    """The tracer and metrics of one app (built in its lifespan), the last hour of finished
    turns (the overview page) and the generation events of running turns (event streams)."""

    tracer: trace.Tracer
    metrics: GatewayMetrics
    history: TurnHistory = field(default_factory=TurnHistory)
    live: LiveTurns = field(default_factory=LiveTurns)

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


def record_of(outcome: TurnOutcome, ended: TurnEnded) -> TurnRecord:
    return TurnRecord(finished_ms=outcome.finished_ns // 1_000_000,
                      worker=ended.turn.worker or "",
                      ttft_ms=outcome.ttft_s * 1000 if outcome.has_ttft else None,
                      input_tokens=outcome.input_tokens, cached_tokens=outcome.cached_tokens,
                      output_tokens=outcome.output_tokens)


def live_event(event: TurnEvent, input_turn_id: str) -> dict[str, Any] | None:
    """The event stream's view of a turn event while it generates (None: nothing to show).
    Tool calls show as text: the name, then the arguments as they are written."""
    text = None
    if isinstance(event, TextDelta):
        text = event.text
    elif isinstance(event, ToolCallStart):
        text = f"\n→ {event.name} "
    elif isinstance(event, ToolCallDelta):
        text = event.arguments
    if not text:
        return None
    return {"type": "generation.delta", "input_turn_id": input_turn_id, "text": text}


def _ended(live: LiveTurns, session_id: str, started: TurnStarted | None) -> None:
    if started is not None:
        live.publish(session_id, {"type": "generation.ended",
                                  "input_turn_id": started.input_turn_id})


async def traced_turn(telemetry: Telemetry, events: AsyncGenerator[TurnEvent, None], *,
                      model: str, session_id: str, max_tokens: int | None = None
                      ) -> AsyncGenerator[TurnEvent, None]:
    """`events`, unchanged. Closing this generator closes `events` (which aborts the engine
    request). Re-raises whatever `events` raises, after ending the span with that error."""
    chat = ChatSpan(telemetry.tracer, model, session_id, max_tokens=max_tokens)
    live = telemetry.live
    started: TurnStarted | None = None
    try:
        async with aclosing(events):
            async for event in events:
                if isinstance(event, TurnStarted):
                    started = event
                    chat.set_model(event.model or model)
                    chat.turn_started(event.input_turn_id, event.parent_turn_id)
                    live.publish(session_id, {"type": "generation.started",
                                              "input_turn_id": event.input_turn_id,
                                              "parent_turn_id": event.parent_turn_id})
                elif isinstance(event, TurnEnded):
                    outcome = outcome_of(started, event)
                    chat.finish(outcome)
                    telemetry.metrics.observe_turn(outcome)
                    telemetry.history.record(record_of(outcome, event))
                    _ended(live, session_id, started)
                    started = None  # the stream may be left unread from here (native route)
                elif started is not None and live.watched(session_id):
                    delta = live_event(event, started.input_turn_id)
                    if delta is not None:
                        live.publish(session_id, delta)
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
        _ended(live, session_id, started)
        if not chat.is_ended:  # exhausted without TurnEnded: a bug upstream, not a success
            chat.fail("incomplete")
