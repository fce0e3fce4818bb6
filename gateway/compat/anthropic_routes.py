"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic Messages over the tree.

Streaming follows the API's framing exactly (wire-formats.md §4): every frame is
`event: <type>` plus `data: {"type": <type>, ...}`; `message_start`, a `ping`, then per content
block `content_block_start` / `content_block_delta`* (`text_delta`, or `input_json_delta` with
`partial_json` fragments for a `tool_use` block) / `content_block_stop`, then `message_delta`
(`stop_reason`, cumulative `usage`) and `message_stop`. A failure mid-stream is `event: error`.
`message_start` reports zero input tokens: the cache hit is known only when the engine finishes,
so `message_delta.usage` carries `input_tokens` (computed, i.e. not cached) and
`cache_read_input_tokens` (the engine's prefix-cache hit), which clients take over.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.compat.anthropic_mapping import conversation_of
from gateway.compat.anthropic_schemas import CountTokensRequest, MessagesRequest
from gateway.compat.conversation import Conversation
from gateway.compat.runner import TURN_HEADER, CompatDep, SessionHintDep, StartedTurn, final_turn
from gateway.deps import PrincipalDep, TenantDep
from gateway.errors import exception_error, request_id_of
from gateway.keepalive import ANTHROPIC_PING, keepalive
from gateway.rate_limits import refunded_on_error
from gateway.toolcall_parser import TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from gateway.turns import TurnEnded
from gateway.views import SSE_HEADERS
from sessions import Turn

router = APIRouter(prefix="/v1/messages", tags=["anthropic"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"description": 'Anthropic error body {"type": "error", "error": {type, message}}'}
    for code in (400, 401, 404, 413, 529)}
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


@router.post("", responses={
    **_ERRORS, 200: {"content": {"application/json": {}, "text/event-stream": {}}}})
async def create_message(body: MessagesRequest, request: Request, principal: PrincipalDep,
                         compat: CompatDep, session_hint: SessionHintDep = None) -> Response:
    conversation = conversation_of(body)
    admission = await compat.admit(principal, conversation.generation.max_tokens)
    async with refunded_on_error(admission):
        turn = await compat.start(principal.tenant, conversation, session_hint=session_hint)
    message_id = f"msg_{turn.started.input_turn_id}"
    request_id = request_id_of(request)
    headers = {**turn.headers, "request-id": request_id or ""}  # where the SDK looks for it
    if conversation.stream:
        return StreamingResponse(keepalive(frames(turn, conversation, message_id, request_id),
                                           compat.settings.sse_keepalive_s, ANTHROPIC_PING),
                                 media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **headers})
    ended = await final_turn(turn.events)
    body_out = {**_message_head(message_id, conversation), "content": content(ended.turn),
                **stop_reason(ended, conversation),
                "usage": {**usage(ended.turn), "service_tier": "standard"}}
    return JSONResponse(body_out, headers={**headers, TURN_HEADER: ended.turn.id})


@router.post("/count_tokens", responses=_ERRORS)
async def count_tokens(body: CountTokensRequest, tenant: TenantDep,
                       compat: CompatDep) -> dict[str, int]:
    compat.check_model(body.model)
    return {"input_tokens": compat.count_tokens(conversation_of(body))}


def _message_head(message_id: str, conversation: Conversation) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant",
            "model": conversation.model}


def usage(turn: Turn) -> dict[str, int]:
    """Anthropic usage: `input_tokens` excludes the cached ones (they are cache reads)."""
    u = turn.usage or {}
    cached = int(u.get("cached_tokens", 0))
    return {"input_tokens": int(u.get("input_tokens", 0)) - cached,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": int(u.get("output_tokens", 0))}


def content(turn: Turn) -> list[dict[str, Any]]:
    """The reply's content blocks: its text (when any, or when there is nothing else), then one
    `tool_use` block per call."""
    text = turn.messages[0].get("content") if turn.messages else ""
    blocks: list[dict[str, Any]] = []
    if text or not turn.tool_calls:
        blocks.append({"type": "text", "text": text or ""})
    blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["arguments"]}
               for c in turn.tool_calls]
    return blocks


def stop_reason(ended: TurnEnded, conversation: Conversation) -> dict[str, str | None]:
    """`stop_reason` and `stop_sequence` (known only when a single one was given: the engine
    cuts the stop string without naming it)."""
    reason = _STOP.get(ended.turn.finish_reason or "", "end_turn")
    done, stops = ended.finished, conversation.generation.stop
    if reason == "end_turn" and stops and done is not None and done.stop_token_id is None:
        # Stopped by a stop string, not by the end-of-turn token.
        return {"stop_reason": "stop_sequence", "stop_sequence": stops[0] if len(stops) == 1
                else None}
    return {"stop_reason": reason, "stop_sequence": None}


def _frame(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps({'type': event, **data})}\n\n".encode()


class _Blocks:
    """The open content block of a streamed message; indexes count from 0 in order."""

    def __init__(self) -> None:
        self.num_blocks = 0
        self.open_kind: str | None = None

    def start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.stop()
        self.open_kind = block["type"]
        out.append(_frame("content_block_start",
                          {"index": self.num_blocks, "content_block": block}))
        self.num_blocks += 1
        return out

    def delta(self, delta: dict[str, Any]) -> bytes:
        return _frame("content_block_delta", {"index": self.num_blocks - 1, "delta": delta})

    def stop(self) -> list[bytes]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [_frame("content_block_stop", {"index": self.num_blocks - 1})]


async def frames(turn: StartedTurn, conversation: Conversation, message_id: str,
                 request_id: str | None) -> AsyncGenerator[bytes, None]:
    """The SSE body of a streamed message. Closing it aborts the engine request."""
    empty_usage = {"input_tokens": 0, "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 0, "output_tokens": 0, "service_tier": "standard"}
    blocks = _Blocks()
    async with aclosing(turn.events):
        yield _frame("message_start", {"message": {
            **_message_head(message_id, conversation), "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": empty_usage}})
        yield _frame("ping", {})
        try:
            async for event in turn.events:
                out: list[bytes] = []
                if isinstance(event, TextDelta):
                    if blocks.open_kind != "text":
                        out += blocks.start({"type": "text", "text": ""})
                    out.append(blocks.delta({"type": "text_delta", "text": event.text}))
                elif isinstance(event, ToolCallStart):
                    out += blocks.start({"type": "tool_use", "id": event.id, "name": event.name,
                                         "input": {}})
                elif isinstance(event, ToolCallDelta):
                    out.append(blocks.delta({"type": "input_json_delta",
                                             "partial_json": event.arguments}))
                elif isinstance(event, ToolCallEnd):
                    out += blocks.stop()
                elif isinstance(event, TurnEnded):
                    if blocks.num_blocks == 0:
                        out += blocks.start({"type": "text", "text": ""})
                    out += blocks.stop()
                    out.append(_frame("message_delta", {
                        "delta": stop_reason(event, conversation),
                        "usage": usage(event.turn)}))
                    out.append(_frame("message_stop", {}))
                for frame in out:
                    yield frame
        except Exception as exc:  # noqa: BLE001 - mid-stream errors become an error event
            _, body = exception_error("anthropic", exc, request_id)
            yield _frame("error", {k: v for k, v in body.items() if k != "type"})
