"""The SDK's public types: pydantic mirrors of `gateway/schemas.py` and the SSE events.

Response models allow unknown fields (`extra="allow"`) so a newer server never breaks an older
client; unknown SSE event types are skipped by the stream, never raised.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

MessageRole = Literal["user", "tool", "system", "assistant"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Message(_Model):
    """One chat message. `content` is text or a list of content blocks."""

    role: MessageRole
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant message's calls (replay)


class MessageParam(TypedDict):
    role: MessageRole
    content: NotRequired[str | list[dict[str, Any]] | None]
    name: NotRequired[str]
    tool_call_id: NotRequired[str]  # role "tool": the call this message is the result of
    tool_calls: NotRequired[list[dict[str, Any]]]


class GenerateParams(TypedDict, total=False):
    """`generate` options of an append (`stream` is chosen by the method, not passed)."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str]
    # sessions with tools: "auto" (default) | "required" | "none" | {"name": ...}
    tool_choice: Literal["auto", "required", "none"] | dict[str, str]
    parallel_tool_calls: bool  # False: at most one tool call per turn
    # structured output: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
    # (the answer is one JSON value matching the schema), {"type": "json_object"}, or
    # {"type": "text"} (the default)
    response_format: dict[str, Any]


class Usage(_Model):
    """A generated turn's tokens and (turns stored since the server kept them) the engine's
    timings in ms and its drafting."""

    input_tokens: int
    cached_tokens: int
    computed_tokens: int
    output_tokens: int
    ttft_ms: float | None = None
    queue_ms: float | None = None
    decode_ms: float | None = None
    decode_tokens_per_s: float | None = None
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None


class Turn(_Model):
    """One turn of the tree. Assistant turns carry `content`, `usage` and `finish_reason`;
    `tool_calls` are `[{"id", "name", "arguments": {...}}]` (finish_reason "tool_calls"), and
    `content` is the text without the tool-call markup."""

    id: str
    session_id: str
    parent_id: str | None
    role: str
    depth: int
    version: int
    created_ms: int
    num_tokens: int
    content: str | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None
    branch: str | None = None


class SessionCreated(_Model):
    id: str
    branch: str
    head_turn_id: str
    version: int


class TurnSummary(_Model):
    id: str
    parent_id: str | None
    role: str
    depth: int
    num_tokens: int


class SessionState(_Model):
    """`GET /v1/sessions/{id}`: the session, its branches and its turn tree."""

    id: str
    model: str
    version: int
    created_ms: int
    root_turn_id: str
    default_branch: str
    branches: dict[str, str]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    turns: list[TurnSummary] = Field(default_factory=list)


class BranchState(_Model):
    """Answer of fork and rewind: the session's branches after the change."""

    id: str
    version: int
    branches: dict[str, str]


# ---- stream events -------------------------------------------------------------------------


class TurnStart(_Model):
    type: Literal["turn_start"]
    input_turn_id: str
    parent_turn_id: str | None = None


class TextDelta(_Model):
    type: Literal["text_delta"]
    text: str


class ToolCallStart(_Model):
    """The model opened call `index` (0, 1, ... within the turn) to tool `name`."""

    type: Literal["tool_call_start"]
    index: int
    id: str
    name: str


class ToolCallDelta(_Model):
    """A fragment of call `index`'s arguments as JSON text; a call's fragments concatenate to
    exactly its arguments' JSON."""

    type: Literal["tool_call_delta"]
    index: int
    arguments: str


class ToolCallEnd(_Model):
    """Call `index` is complete; `arguments` is the parsed object."""

    type: Literal["tool_call_end"]
    index: int
    id: str
    name: str
    arguments: dict[str, Any]


class TurnEnd(_Model):
    type: Literal["turn_end"]
    turn: Turn
    timings: dict[str, Any] | None = None  # server-side phase timings, when the gateway sends them


class ErrorDetail(_Model):
    type: str
    message: str
    status: int | None = None  # on stream `error` events: the HTTP status this error has
    retryable: bool | None = None  # on stream `error` events: may the same request succeed?


class ErrorEvent(_Model):
    """Also the body of every HTTP error answer."""

    type: Literal["error"]
    error: ErrorDetail
    request_id: str | None = None


StreamEvent = Annotated[
    TurnStart | TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd | TurnEnd | ErrorEvent,
    Field(discriminator="type")]
STREAM_EVENT_ADAPTER: TypeAdapter[StreamEvent] = TypeAdapter(StreamEvent)
KNOWN_EVENTS = frozenset({"turn_start", "text_delta", "tool_call_start", "tool_call_delta",
                          "tool_call_end", "turn_end", "error"})
