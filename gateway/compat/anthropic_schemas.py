"""Request models of `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic Messages).

Every model accepts unknown fields (`extra="allow"`): Claude Code sends `context_management`,
`thinking`, `metadata`, `cache_control` and fields of betas this gateway never heard of, and a
400 on any of them breaks the client (wire-formats.md §8). Content blocks stay plain dicts; the
mapping reads the types it knows and rejects the ones it cannot render.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.cache_scope import CacheSalt


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ToolSpec(_Open):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoiceSpec(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False  # True: at most one tool_use block per reply


class MessageParam(_Open):
    # "system": a mid-conversation system turn (Claude Code sends one under a beta)
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Open):
    model: str = Field(min_length=1, max_length=256)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolSpec] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoiceSpec | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    # Structured output: {"format": {"type": "json_schema", "schema": {...}}} (anthropic SDK 2.x;
    # other keys such as "effort" are ignored); `output_format` is the same format as the
    # structured-outputs beta sent it, at the top level.
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None
    cache_salt: CacheSalt = None  # splits the tenant's prefix-cache namespace
