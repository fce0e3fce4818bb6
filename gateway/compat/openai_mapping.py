"""OpenAI Chat Completions request → `Conversation`.

Leading system / developer messages become the session's system prompt; later ones stay in the
conversation as native system messages. Assistant `tool_calls` carry their arguments as JSON text
on the wire and as a dict natively; tool messages keep their `tool_call_id`. `response_format`
(`json_schema`, `json_object`, `text`) is normalized and checked against the grammar engine here,
before anything is written.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.compat.conversation import (
    Conversation,
    Generation,
    ToolChoice,
    function_tool,
    text_of,
)
from gateway.compat.openai_schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice
from gateway.errors import InvalidRequest
from gateway.response_format import normalize_response_format

DEFAULT_MAX_TOKENS = 4096  # the API's default is "up to the context"; the settings cap applies


def conversation_of(request: ChatCompletionRequest) -> Conversation:
    """Raises InvalidRequest (400) for what the gateway cannot honour."""
    _check_supported(request)
    messages = list(request.messages)
    system_parts: list[str] = []
    while messages and messages[0].role in ("system", "developer"):
        system_parts.append(text_of(messages.pop(0).content, where="messages[0].content"))
    offset = len(request.messages) - len(messages)
    native = [_native(m, f"messages[{i + offset}]") for i, m in enumerate(messages)]
    if not native:
        raise InvalidRequest("messages: at least one user or tool message is required")
    tools = tuple(function_tool(t.function.name, t.function.description, t.function.parameters)
                  for t in request.tools or ())
    stop = request.stop if isinstance(request.stop, list) else [request.stop] if request.stop \
        else []
    generation = Generation(
        max_tokens=request.max_completion_tokens or request.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p, seed=request.seed,
        stop=tuple(s for s in stop if s), tool_choice=_tool_choice(request, tools),
        parallel_tool_calls=request.parallel_tool_calls is not False,
        response_format=normalize_response_format(request.response_format,
                                                  param="response_format"))
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return Conversation(model=request.model, system="\n".join(system_parts) or None,
                        messages=tuple(native), generation=generation, tools=tools,
                        stream=request.stream, include_usage=include_usage,
                        cache_salt=request.cache_salt)


def _check_supported(request: ChatCompletionRequest) -> None:
    if request.n is not None and request.n > 1:
        raise InvalidRequest("n: only one choice per request is supported")
    if request.logprobs:
        raise InvalidRequest("logprobs: not supported")


def _native(message: ChatMessage, where: str) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    text = text_of(message.content, where=f"{where}.content")
    if role == "tool":
        if not message.tool_call_id:
            raise InvalidRequest(f"{where}.tool_call_id: required for a tool message")
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": text}
    native: dict[str, Any] = {"role": role, "content": text}
    if role == "assistant" and message.tool_calls:
        native["tool_calls"] = [
            {"id": call.id, "name": call.function.name,
             "arguments": _arguments(call.function.arguments, f"{where}.tool_calls[{i}]")}
            for i, call in enumerate(message.tool_calls)]
    return native


def _arguments(raw: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except ValueError as exc:
        raise InvalidRequest(f"{where}.function.arguments: not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where}.function.arguments: must be a JSON object")
    return value


def _tool_choice(request: ChatCompletionRequest, tools: tuple[dict[str, Any], ...]
                 ) -> ToolChoice | None:
    choice = request.tool_choice
    if not tools:
        if choice not in (None, "none", "auto"):
            raise InvalidRequest("tool_choice: names a tool but no tools are declared")
        return None
    if isinstance(choice, NamedToolChoice):
        names = {t["function"]["name"] for t in tools}
        if choice.function.name not in names:
            raise InvalidRequest(f"tool_choice: unknown tool {choice.function.name!r}")
        return ToolChoice("named", choice.function.name)
    return ToolChoice(choice or "auto")
