"""Request models of the OpenAI Responses API (`POST /v1/responses`, `/input_tokens`).

Unknown fields are accepted and ignored (`extra="allow"`): Codex, openai-agents and the SDK send
options (`service_tier`, `safety_identifier`, `stream_options`, ...) with no effect here. Items
stay plain dicts: `gateway.compat.responses_items` checks them one by one, so a malformed item's
400 names its exact `param` (`input[3].call_id`) in OpenAI's error shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.cache_scope import CacheSalt


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ResponseInputRequest(_Open):
    """What `POST /v1/responses/input_tokens` counts: the parts of a create request that make the
    prompt."""

    model: str | None = Field(default=None, max_length=256)
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, max_length=256)
    conversation: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=256)


class ResponseCreateRequest(ResponseInputRequest):
    model: str = Field(min_length=1, max_length=256)
    store: bool = True
    stream: bool = False
    background: bool = False
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    text: dict[str, Any] | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    reasoning: dict[str, Any] | None = None  # accepted; this model does not reason
    max_tool_calls: int | None = Field(default=None, ge=1)
    user: str | None = None
    cache_salt: CacheSalt = None  # splits the tenant's prefix-cache namespace
