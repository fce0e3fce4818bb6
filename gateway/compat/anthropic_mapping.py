"""Anthropic Messages request → `Conversation`.

A user message's `tool_result` blocks become native tool messages (in order, before the user's
text, as the API requires them first); an assistant message's `tool_use` blocks become its
`tool_calls`, and `thinking` blocks are dropped (the served model has no thinking to echo).
`output_config.format` (JSON-schema output) becomes the native `response_format`. System blocks
are joined with newlines, except Claude Code's `x-anthropic-billing-header:` line:
it is billing metadata for Anthropic's API, not instructions, and it changes with every
conversation, so rendering it would leave two conversations with one system prompt no prefix
to share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.compat.anthropic_schemas import (
    CountTokensRequest,
    MessageParam,
    MessagesRequest,
    ToolChoiceSpec,
)
from gateway.compat.conversation import (
    Conversation,
    Generation,
    ToolChoice,
    function_tool,
    text_of,
)
from gateway.errors import InvalidRequest
from gateway.response_format import normalize_response_format

_IGNORED_ASSISTANT_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def conversation_of(request: CountTokensRequest) -> Conversation:
    """Raises InvalidRequest (400) for content the gateway cannot render."""
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(request.messages):
        messages.extend(_native(message, f"messages[{i}]"))
    tools = tuple(function_tool(t.name, t.description, t.input_schema)
                  for t in request.tools or ())
    generation = Generation(max_tokens=1, tool_choice=_tool_choice(request.tool_choice, tools))
    stream = False
    cache_salt = None
    if isinstance(request, MessagesRequest):
        cache_salt = request.cache_salt
        generation = Generation(
            max_tokens=request.max_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p, top_k=request.top_k or 0,
            stop=tuple(s for s in request.stop_sequences or () if s),
            tool_choice=generation.tool_choice,
            parallel_tool_calls=not (request.tool_choice is not None
                                     and request.tool_choice.disable_parallel_tool_use),
            response_format=_output_format(request))
        stream = request.stream
    system = _system_text(request.system)
    return Conversation(model=request.model, system=system or None, messages=tuple(messages),
                        generation=generation, tools=tools, stream=stream,
                        cache_salt=cache_salt)


BILLING_HEADER = "x-anthropic-billing-header:"


def _output_format(request: MessagesRequest) -> dict[str, Any] | None:
    """The native response format of `output_config.format` (else the beta's `output_format`).
    Raises InvalidRequest (400) for a format the grammar engine cannot honour."""
    config = request.output_config or {}
    if config.get("format") is not None:
        return normalize_response_format(config["format"], param="output_config.format")
    return normalize_response_format(request.output_format, param="output_format")


def _system_text(system: str | list[dict[str, Any]] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system
    texts = [text_of([block], where=f"system[{i}]") for i, block in enumerate(system)]
    return "\n".join(t for t in texts if not t.startswith(BILLING_HEADER))


def _native(message: MessageParam, where: str) -> list[dict[str, Any]]:
    if message.role == "system":  # an empty one (Claude Code's placeholder) adds nothing
        text = text_of(message.content, where=f"{where}.content")
        return [{"role": "system", "content": text}] if text else []
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        return [_assistant(message.content, where)]
    out: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    for j, block in enumerate(message.content):
        if block.get("type") == "tool_result":
            out.append(_tool_result(block, f"{where}.content[{j}]"))
        else:
            texts.append(block)
    if texts or not out:
        out.append({"role": "user", "content": text_of(texts, where=f"{where}.content")})
    return out


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "tool_use":
            arguments = block.get("input", {})
            if not isinstance(arguments, Mapping) or not isinstance(block.get("name"), str):
                raise InvalidRequest(f"{where}.content[{j}]: tool_use needs a name and an "
                                     "object input")
            calls.append({"id": str(block.get("id", "")), "name": block["name"],
                          "arguments": dict(arguments)})
        elif kind not in _IGNORED_ASSISTANT_BLOCKS:
            texts.append(block)
    native: dict[str, Any] = {"role": "assistant",
                              "content": text_of(texts, where=f"{where}.content")}
    if calls:
        native["tool_calls"] = calls
    return native


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise InvalidRequest(f"{where}.tool_use_id: required for a tool_result block")
    content = block.get("content")
    text = text_of(content if content is not None else "", where=f"{where}.content")
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}


def _tool_choice(choice: ToolChoiceSpec | None, tools: tuple[dict[str, Any], ...]
                 ) -> ToolChoice | None:
    if not tools:
        if choice is not None and choice.type in ("any", "tool"):
            raise InvalidRequest("tool_choice: requires tools, but none are declared")
        return None
    if choice is None or choice.type == "auto":
        return ToolChoice("auto")
    if choice.type == "any":
        return ToolChoice("required")
    if choice.type == "none":
        return ToolChoice("none")
    names = {t["function"]["name"] for t in tools}
    if not choice.name or choice.name not in names:
        raise InvalidRequest(f"tool_choice.name: unknown tool {choice.name!r}")
    return ToolChoice("named", choice.name)
