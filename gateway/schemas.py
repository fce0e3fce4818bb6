"""HTTP request and response models of the native session API (`/v1/sessions`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.cache_scope import CacheSalt

MessageRole = Literal["user", "tool", "system", "assistant"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenAIFunction(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class OpenAITool(_Strict):
    """`{"type": "function", "function": {name, description, parameters}}`."""

    type: Literal["function"]
    function: OpenAIFunction


class AnthropicTool(_Strict):
    """`{"name", "description", "input_schema"}`."""

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]


class CreateSessionRequest(_Strict):
    model: str | None = None
    system: str | None = Field(default=None, max_length=200_000)
    tools: list[OpenAITool | AnthropicTool] = Field(default_factory=list, max_length=128)
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionCreated(BaseModel):
    id: str
    branch: str
    head_turn_id: str
    version: int


class SessionView(BaseModel):
    id: str
    model: str
    version: int
    created_ms: int
    root_turn_id: str
    default_branch: str
    branches: dict[str, str]
    system: str | list[dict[str, Any]] | None
    tools: list[dict[str, Any]]
    metadata: dict[str, Any]
    turns: list[TurnSummaryView]


class TurnSummaryView(BaseModel):
    id: str
    parent_id: str | None
    role: str
    depth: int
    num_tokens: int


class Message(BaseModel):
    """One chat message. `content` is text or a list of content blocks (`{"type": "text", ...}`)."""

    model_config = ConfigDict(extra="allow")

    role: MessageRole
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None  # role "tool": the id of the call this is the result of
    # role "assistant" (replayed history): [{"id", "name", "arguments": {...}}] or OpenAI's shape
    tool_calls: list[dict[str, Any]] | None = None


class NamedToolChoice(_Strict):
    """`{"name": ...}`: the output is exactly one call to that tool."""

    type: Literal["function", "tool"] | None = None
    name: str = Field(min_length=1, max_length=128)


ToolChoice = Literal["auto", "required", "none"] | NamedToolChoice


class GenerateOptions(_Strict):
    """Sampling options. `tool_choice` (sessions with tools; default "auto"): "auto" lets the
    model call a declared tool or answer in text, "required" makes it call one or more, "none"
    forbids calls, {"name": ...} makes it call that tool (once). Calls always match the tool
    schemas. `parallel_tool_calls` False ends the output after the first call.
    `response_format` (structured output): `{"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}` makes the answer one JSON value matching the schema, `{"type":
    "json_object"}` any JSON object, `{"type": "text"}` (the default) plain text; under "auto"
    the turn is then either tool calls or that JSON (`gateway.response_format`)."""

    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list, max_length=16)
    stream: bool = False
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True  # False: at most one call per turn
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _stop_non_empty(self) -> GenerateOptions:
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        return self


class AppendTurnRequest(_Strict):
    branch: str | None = None
    parent_turn_id: str | None = None
    messages: list[Message] = Field(min_length=1)
    generate: GenerateOptions = Field(default_factory=GenerateOptions)
    # Splits the tenant's prefix-cache namespace (`gateway.cache_scope`): turns with another
    # salt (or none) never reuse this turn's cached KV.
    cache_salt: CacheSalt = None


class Usage(BaseModel):
    """A generated turn's tokens, and (turns stored since the timings were kept) the engine's
    timings and drafting: ms from arrival to the first token, queued, and decoding."""

    input_tokens: int
    cached_tokens: int
    computed_tokens: int
    output_tokens: int
    ttft_ms: float | None = None
    queue_ms: float | None = None
    decode_ms: float | None = None
    decode_tokens_per_s: float | None = None  # tokens after the first over decode_ms
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None


class TurnView(BaseModel):
    """One turn of the tree. Assistant turns carry `content`, `usage` and `finish_reason`;
    `tool_calls` are `[{"id", "name", "arguments": {...}}]` (then finish_reason "tool_calls"),
    and `content` is the text without the tool-call markup."""

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
    branch: str | None = None  # the branch this append moved (append responses only)


class ForkRequest(_Strict):
    from_turn_id: str
    branch: str


class RewindRequest(_Strict):
    branch: str
    to_turn_id: str


class BranchView(BaseModel):
    id: str
    version: int
    branches: dict[str, str]


class Health(BaseModel):
    status: Literal["ok"]


class WorkerReadiness(BaseModel):
    name: str  # the gateway's name for it (its address), '' for an in-process engine
    worker_id: str
    up: bool
    pid: int | None = None
    restarts: int = 0
    num_running: int | None = None


class Readiness(BaseModel):
    status: Literal["ok", "unavailable"]
    redis: bool
    engine: bool
    model: str | None = None
    engine_pid: int | None = None
    engine_restarts: int = 0
    store_pid: int | None = None  # the embedded Valkey's, when `serve` started one
    store_restarts: int = 0
    num_running: int | None = None
    num_free_pages: int | None = None
    num_pages: int | None = None
    num_cached_pages: int | None = None  # evictable cache plus pages locked by requests
    num_held_pages: int | None = None  # neither free nor evictable: held by requests in flight
    num_pins: int | None = None
    prefix_hit_rate: float | None = None
    workers: list[WorkerReadiness] = []


SessionView.model_rebuild()
