"""`POST /v1/chat/completions`: OpenAI Chat Completions over the session tree.

Streaming follows the API exactly (wire-formats.md §2): `data: {chunk}` frames without `event:`,
a first chunk with the role, content and tool-call deltas (a call's first delta carries its
`index`, `id`, `type` and `function.name` with `arguments: ""`; later ones only `index` and
argument fragments), a last chunk with `finish_reason`, with `stream_options.include_usage` a
final `choices: []` chunk with the usage (and `usage: null` on every other chunk), then
`data: [DONE]`. A failure mid-stream is `data: {"error": {...}}` and ends the stream.
`usage.prompt_tokens_details.cached_tokens` is the engine's prefix-cache hit.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.compat.conversation import Conversation
from gateway.compat.openai_mapping import conversation_of
from gateway.compat.openai_schemas import ChatCompletionRequest
from gateway.compat.runner import TURN_HEADER, CompatDep, SessionHintDep, StartedTurn, final_turn
from gateway.deps import PrincipalDep
from gateway.errors import exception_error, request_id_of
from gateway.keepalive import SSE_COMMENT_PING, keepalive
from gateway.rate_limits import refunded_on_error
from gateway.toolcall_parser import TextDelta, ToolCallDelta, ToolCallStart
from gateway.turns import TurnEnded
from gateway.views import SSE_HEADERS
from sessions import Turn

router = APIRouter(prefix="/v1", tags=["openai"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"description": 'OpenAI error body {"error": {message, type, param, code}}'}
    for code in (400, 401, 404, 413, 503)}
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


@router.post("/chat/completions", responses={
    **_ERRORS, 200: {"content": {"application/json": {}, "text/event-stream": {}}}})
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           principal: PrincipalDep, compat: CompatDep,
                           session_hint: SessionHintDep = None) -> Response:
    conversation = conversation_of(body)
    admission = await compat.admit(principal, conversation.generation.max_tokens)
    async with refunded_on_error(admission):
        turn = await compat.start(principal.tenant, conversation, session_hint=session_hint)
    head = _head(turn, conversation)
    if conversation.stream:
        return StreamingResponse(
            keepalive(chunks(turn, conversation, head, request_id_of(request)),
                      compat.settings.sse_keepalive_s, SSE_COMMENT_PING),
            media_type="text/event-stream", headers={**SSE_HEADERS, **turn.headers})
    ended = await final_turn(turn.events)
    return JSONResponse(completion(head, ended.turn),
                        headers={**turn.headers, TURN_HEADER: ended.turn.id})


def _head(turn: StartedTurn, conversation: Conversation) -> dict[str, Any]:
    return {"id": f"chatcmpl-{turn.started.input_turn_id}", "created": int(time.time()),
            "model": conversation.model, "system_fingerprint": None}


def usage(turn: Turn) -> dict[str, Any]:
    u = turn.usage or {}
    prompt, output = int(u.get("input_tokens", 0)), int(u.get("output_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": int(u.get("cached_tokens", 0))}}


def completion(head: dict[str, Any], turn: Turn) -> dict[str, Any]:
    """The `chat.completion` object of a finished turn."""
    content = turn.messages[0].get("content") if turn.messages else ""
    calls = [{"id": c["id"], "type": "function",
              "function": {"name": c["name"],
                           "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
             for c in turn.tool_calls]
    message: dict[str, Any] = {"role": "assistant",
                               "content": content if content or not calls else None,
                               "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return {**head, "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": _FINISH.get(turn.finish_reason or "", "stop")}],
            "usage": usage(turn)}


def _data(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def chunks(turn: StartedTurn, conversation: Conversation, head: dict[str, Any],
                 request_id: str | None) -> AsyncGenerator[bytes, None]:
    """The SSE body of a streamed completion. Closing it aborts the engine request."""
    base = {**head, "object": "chat.completion.chunk"}
    if conversation.include_usage:
        base["usage"] = None

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return _data({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                           "finish_reason": finish_reason}]})

    async with aclosing(turn.events):
        yield chunk({"role": "assistant", "content": ""})
        try:
            async for event in turn.events:
                if isinstance(event, TextDelta):
                    yield chunk({"content": event.text})
                elif isinstance(event, ToolCallStart):
                    yield chunk({"tool_calls": [{
                        "index": event.index, "id": event.id, "type": "function",
                        "function": {"name": event.name, "arguments": ""}}]})
                elif isinstance(event, ToolCallDelta):
                    yield chunk({"tool_calls": [{"index": event.index,
                                                 "function": {"arguments": event.arguments}}]})
                elif isinstance(event, TurnEnded):
                    yield chunk({}, _FINISH.get(event.turn.finish_reason or "", "stop"))
                    if conversation.include_usage:
                        yield _data({**base, "choices": [], "usage": usage(event.turn)})
            yield b"data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001 - mid-stream errors become an error frame
            _, body = exception_error("openai", exc, request_id)
            yield _data(body)
