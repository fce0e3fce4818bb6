"""Request models of `POST /v1/chat/completions` (OpenAI Chat Completions).

Unknown fields are accepted and ignored (`extra="allow"`): clients send many options this gateway
has no use for. Options that would change the answer and are not supported (`n > 1`, `logprobs`)
are rejected by the mapping with a 400, and so is a `response_format` the grammar engine cannot
honour (`gateway.response_format`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from gateway.cache_scope import CacheSalt


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionSpec(_Open):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_Open):
    type: Literal["function"]
    function: FunctionSpec


class CalledFunction(_Open):
    name: str = Field(min_length=1, max_length=128)
    arguments: str = "{}"  # JSON text, as the API sends it


class ToolCall(_Open):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class NamedFunction(_Open):
    name: str = Field(min_length=1, max_length=128)


class NamedToolChoice(_Open):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Open):
    include_usage: bool = False


class ChatCompletionRequest(_Open):
    model: str = Field(min_length=1, max_length=256)
    # `input`: some clients send Responses-shaped bodies here (wire-formats.md §3).
    messages: list[ChatMessage] = Field(
        min_length=1, validation_alias=AliasChoices("messages", "input"))
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[ToolSpec] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # False: at most one call per reply
    n: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    # {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema": {name, schema,
    # strict, description}}
    response_format: dict[str, Any] | None = None
    cache_salt: CacheSalt = None  # splits the tenant's prefix-cache namespace (vLLM's field)
