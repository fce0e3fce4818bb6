"""Store objects → response models, and the SSE stream of a turn."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any, Protocol

from gateway.error_catalog import kind_of
from gateway.errors import error_body, error_message, status_for
from gateway.generation import TurnInterrupted, TurnResume
from gateway.schemas import SessionView, TurnSummaryView, TurnView, Usage
from gateway.toolcall_parser import ToolCallDelta, ToolCallEnd, ToolCallStart
from gateway.tree_views import usage_view
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
    usage = Usage.model_validate(usage_view(turn.usage)) if turn.usage else None
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


class StreamRecord(Protocol):
    """Where a stream's outcome is kept for retries with its Idempotency-Key."""

    async def ended(self, parent_turn_id: str, turn: dict[str, Any]) -> None: ...

    async def interrupted(self, resume: TurnResume, num_events: int) -> None: ...

    async def failed(self) -> None: ...


async def sse_stream(first: TurnStarted, events: AsyncGenerator[TurnEvent, None],
                     request_id: str | None, *, record: StreamRecord | None = None,
                     num_sent: int = 0) -> AsyncGenerator[bytes, None]:
    """`turn_start`, (`text_delta` | `tool_call_start` | `tool_call_delta` | `tool_call_end`)*,
    `turn_end` | `error`. Ids are `<input turn id>:<n>`. A continued stream (`num_sent` events
    were sent by the interrupted one) starts at event `num_sent + 1`, without `turn_start`.
    An `error` event carries `retryable`; a `turn_interrupted` one is continued by a retry with
    the same Idempotency-Key. Closing this generator (client disconnect) closes `events`, which
    aborts the engine request."""
    n = num_sent
    ended = False
    async with aclosing(events):
        if num_sent == 0:
            yield sse_frame(f"{first.input_turn_id}:{n}", "turn_start",
                            {"type": "turn_start", "input_turn_id": first.input_turn_id,
                             "parent_turn_id": first.parent_turn_id})
        try:
            async for event in events:
                n += 1
                event_id = f"{first.input_turn_id}:{n}"
                if isinstance(event, TurnEnded):
                    view = turn_view(event.turn, event.branch).model_dump(mode="json")
                    if record is not None:
                        await record.ended(first.parent_turn_id, view)
                    ended = True
                    timings = dataclasses.asdict(event.timings) if event.timings else None
                    yield sse_frame(event_id, "turn_end",
                                    {"type": "turn_end", "turn": view, "timings": timings})
                else:
                    yield _event_frame(event_id, event)
        except Exception as exc:  # noqa: BLE001 - mid-stream errors become an `error` event
            status, error_type = status_for(exc)
            if record is not None:
                if isinstance(exc, TurnInterrupted) and exc.resume is not None:
                    await record.interrupted(exc.resume, n)
                else:
                    await record.failed()
                ended = True
            body = error_body(error_type, error_message(exc, error_type), request_id)
            body["error"].update(status=status, retryable=kind_of(error_type).retryable)
            yield sse_frame(f"{first.input_turn_id}:{n + 1}", "error", body)
        finally:
            if record is not None and not ended:
                await record.failed()  # the client went away (or the server is stopping)


def _event_frame(event_id: str, event: TurnEvent) -> bytes:
    if isinstance(event, TextDelta):
        return sse_frame(event_id, "text_delta", {"type": "text_delta", "text": event.text})
    assert isinstance(event, ToolCallStart | ToolCallDelta | ToolCallEnd), event
    name = _TOOL_EVENTS[type(event)]
    return sse_frame(event_id, name, {"type": name, **dataclasses.asdict(event)})


async def replayed_stream(parent_turn_id: str, turn: dict[str, Any]
                          ) -> AsyncGenerator[bytes, None]:
    """The stream of a turn that finished earlier (a retry with its Idempotency-Key): its text
    as one delta and its tool calls, then `turn_end`."""
    input_id = str(turn["parent_id"])
    frames: list[tuple[str, dict[str, Any]]] = [
        ("turn_start", {"input_turn_id": input_id, "parent_turn_id": parent_turn_id})]
    if turn.get("content"):
        frames.append(("text_delta", {"text": turn["content"]}))
    for index, call in enumerate(turn.get("tool_calls") or []):
        frames += [("tool_call_start", {"index": index, "id": call["id"], "name": call["name"]}),
                   ("tool_call_delta", {"index": index, "arguments": json.dumps(
                       call["arguments"], ensure_ascii=False)}),
                   ("tool_call_end", {"index": index, "id": call["id"], "name": call["name"],
                                      "arguments": call["arguments"]})]
    frames.append(("turn_end", {"turn": turn, "timings": None}))
    for n, (name, data) in enumerate(frames):
        yield sse_frame(f"{input_id}:{n}", name, {"type": name, **data})
