"""The response object of the Responses API: its skeleton before output, the fields a finished
turn sets (status, usage), and the generation options a create request asks for."""

from __future__ import annotations

import time
from typing import Any

from gateway.compat.conversation import Generation
from gateway.compat.openai_mapping import DEFAULT_MAX_TOKENS
from gateway.compat.responses_items import tool_choice_of
from gateway.compat.responses_schemas import ResponseCreateRequest
from gateway.errors import InvalidRequest
from gateway.response_format import normalize_response_format
from sessions import Turn


def generation_of(body: ResponseCreateRequest, tools: tuple[dict[str, Any], ...]) -> Generation:
    text_format = (body.text or {}).get("format")
    response_format = normalize_response_format(text_format, param="text.format")
    parallel = body.parallel_tool_calls is not False and body.max_tool_calls != 1
    return Generation(
        max_tokens=body.max_output_tokens or DEFAULT_MAX_TOKENS,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        tool_choice=tool_choice_of(body.tool_choice, tools), parallel_tool_calls=parallel,
        response_format=response_format)


def ended_fields(turn: Turn) -> dict[str, Any]:
    u = turn.usage or {}
    prompt, output = int(u.get("input_tokens", 0)), int(u.get("output_tokens", 0))
    usage = {"input_tokens": prompt,
             "input_tokens_details": {"cached_tokens": int(u.get("cached_tokens", 0))},
             "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": prompt + output}
    if turn.finish_reason == "length":
        return {"status": "incomplete", "usage": usage,
                "incomplete_details": {"reason": "max_output_tokens"}}
    return {"usage": usage}


def conversation_id_of(raw: str | dict[str, Any]) -> str:
    value = raw.get("id") if isinstance(raw, dict) else raw
    if not isinstance(value, str) or not value:
        raise InvalidRequest("conversation: a conversation id or {\"id\": ...} is required",
                             param="conversation")
    return value


def skeleton(body: ResponseCreateRequest, response_id: str,
             conversation_id: str | None = None) -> dict[str, Any]:
    """The response object before any output (status in_progress)."""
    return {
        "conversation": {"id": conversation_id} if conversation_id else None,
        "id": response_id, "object": "response", "created_at": int(time.time()),
        "status": "in_progress", "background": body.background, "error": None,
        "incomplete_details": None, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "max_tool_calls": body.max_tool_calls,
        "model": body.model, "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "prompt_cache_key": body.prompt_cache_key,
        "reasoning": {"effort": None, "summary": None},
        "store": body.store, "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": body.text or {"format": {"type": "text"}},
        "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": body.truncation or "disabled", "usage": None, "user": body.user,
        "metadata": body.metadata or {}}
