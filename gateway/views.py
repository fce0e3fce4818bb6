"""Store objects → response models, and the SSE stream of a turn."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from gateway.errors import error_body, status_for
from gateway.schemas import SessionView, TurnSummaryView, TurnView, Usage
from gateway.toolcall_parser import ToolCallDelta, ToolCallEnd, ToolCallStart
from gateway.turns import TextDelta, TurnEnded, TurnEvent, TurnStarted
from sessions import Session, Turn, TurnSummary

SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive",
               "X-Accel-Buffering": "no"}
# {index, id, name} / {index, arguments: a fragment of JSON text} / {index, id, name, arguments}
_TOOL_EVENTS: Mapping[type, str] = {ToolCallStart: "tool_call_start",
                                 ToolCallDelta: "tool_call_delta",
                                 ToolCallEnd: "tool_call_end"}


def turn_view(turn: Turn, branch: str | None = None) -> TurnView:
    content = None
    if turn.role == "assistant" and turn.messages:
        content = turn.messages[0].get("content")
    usage = Usage.model_validate(turn.usage) if turn.usage else None
    return TurnView(id=turn.id, session_id=turn.session_id, parent_id=turn.parent_id,
                    role=turn.role, depth=turn.depth, version=turn.version,
                    created_ms=turn.created_ms, num_tokens=turn.num_tokens,
                    content=content if isinstance(content, str) else None,
                    messages=list(turn.messages), tool_calls=list(turn.tool_calls),
                    usage=usage, finish_reason=turn.finish_reason, branch=branch)


def session_view(session: Session, tree: list[TurnSummary]) -> SessionView:
    return SessionView(
        id=session.id, model=session.model, version=session.version,
        created_ms=session.created_ms, root_turn_id=session.root_turn_id,
        default_branch=session.default_branch, branches=dict(session.branches),
        system=session.system, tools=list(session.tools), metadata=session.metadata,
        turns=[TurnSummaryView(id=t.id, parent_id=t.parent_id, role=t.role, depth=t.depth,
                               num_tokens=t.num_tokens) for t in tree])


def sse_frame(event_id: str, event: str, data: dict[str, Any]) -> bytes:
    return f"id: {event_id}\nevent: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def sse_stream(first: TurnStarted, events: AsyncGenerator[TurnEvent, None],
                     request_id: str | None) -> AsyncGenerator[bytes, None]:
    """`turn_start`, (`text_delta` | `tool_call_start` | `tool_call_delta` | `tool_call_end`)*,
    `turn_end` | `error`. Ids are `<input turn id>:<n>`.
    Closing this generator (client disconnect) closes `events`, which aborts the engine request."""
    async with aclosing(events):
        n = 0
        yield sse_frame(f"{first.input_turn_id}:{n}", "turn_start",
                        {"type": "turn_start", "input_turn_id": first.input_turn_id,
                         "parent_turn_id": first.parent_turn_id})
        try:
            async for event in events:
                n += 1
                event_id = f"{first.input_turn_id}:{n}"
                if isinstance(event, TextDelta):
                    yield sse_frame(event_id, "text_delta",
                                    {"type": "text_delta", "text": event.text})
                elif isinstance(event, ToolCallStart | ToolCallDelta | ToolCallEnd):
                    yield sse_frame(event_id, _TOOL_EVENTS[type(event)],
                                    {"type": _TOOL_EVENTS[type(event)],
                                     **dataclasses.asdict(event)})
                elif isinstance(event, TurnEnded):
                    view = turn_view(event.turn, event.branch)
                    timings = dataclasses.asdict(event.timings) if event.timings else None
                    yield sse_frame(event_id, "turn_end",
                                    {"type": "turn_end", "turn": view.model_dump(mode="json"),
                                     "timings": timings})
        except Exception as exc:  # noqa: BLE001 - mid-stream errors become an `error` event
            _, error_type = status_for(exc)
            message = str(exc) if error_type != "api_error" else "internal error"
            yield sse_frame(f"{first.input_turn_id}:{n + 1}", "error",
                            error_body(error_type, message, request_id))
