"""The API-neutral form of a compatible request: native messages plus generation options.

Native messages are what `POST /v1/sessions/{sid}/turns` takes: `{"role", "content"}` with roles
user / assistant / tool / system, assistant `tool_calls: [{"id", "name", "arguments": dict}]` and
tool results `{"role": "tool", "tool_call_id", "content"}`. Tools are OpenAI-shaped
(`{"type": "function", "function": {name, description, parameters}}`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import InvalidRequest

ToolChoiceMode = Literal["auto", "required", "none", "named"]


@dataclass(frozen=True)
class ToolChoice:
    """Which tool calls the reply may contain; `name` only with mode "named"."""

    mode: ToolChoiceMode = "auto"
    name: str | None = None


@dataclass(frozen=True)
class Generation:
    """Sampling options as the client asked for them (`max_tokens` is capped later).
    `response_format`: the structured output, already in the native shape
    (`gateway.response_format.normalize_response_format`); None for text."""

    max_tokens: int
    temperature: float = 1.0  # both APIs default to 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    tool_choice: ToolChoice | None = None  # None: no tools declared
    parallel_tool_calls: bool = True  # False: the reply ends after its first tool call
    response_format: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Conversation:
    """One stateless request. `messages` end with the user / tool messages to answer."""

    model: str  # the name the client asked for (echoed back)
    system: str | None
    messages: tuple[dict[str, Any], ...]
    generation: Generation
    tools: tuple[dict[str, Any], ...] = ()
    stream: bool = False
    include_usage: bool = False  # OpenAI stream_options.include_usage
    cache_salt: str | None = None  # checked by the request model (`gateway.cache_scope`)

    def __post_init__(self) -> None:
        if not self.messages:
            raise InvalidRequest("messages must not be empty")

    def check_answerable(self) -> None:
        """Raise InvalidRequest unless the conversation ends with something to answer."""
        if self.messages[-1]["role"] == "assistant":
            raise InvalidRequest(
                "the last message must be a user or tool message: continuing a partial "
                "assistant message (prefill) is not supported")


def text_of(content: str | Iterable[Any] | None, *, where: str) -> str:
    """Text of a content field: a string, or text blocks joined. Raises InvalidRequest on any
    other block (images, documents, ...), naming `where`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
            continue
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        else:
            raise InvalidRequest(f"{where}: content blocks of type {kind!r} are not supported "
                                 "(only text)")
    return "".join(parts)


def function_tool(name: str, description: str | None, parameters: Mapping[str, Any] | None
                  ) -> dict[str, Any]:
    """A tool in the native (OpenAI) shape."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = dict(parameters) if parameters is not None else {
        "type": "object", "properties": {}}
    return {"type": "function", "function": function}
