"""Engine error types. The gateway maps each to an HTTP status in one place."""

from __future__ import annotations


class EngineError(Exception):
    """Root of every error the engine raises on purpose. `param` names the request field at
    fault where one is (OpenAI's error body carries it)."""

    error_type = "engine_error"

    def __init__(self, *args: object, param: str | None = None) -> None:
        super().__init__(*args)
        self.param = param


class ModelNotFound(EngineError):
    """The model file or package is missing; the message says how to install it."""

    error_type = "model_not_found"


class UnsupportedModel(EngineError):
    """The checkpoint is not a Llama-family decoder this engine can run."""

    error_type = "unsupported_model"


class RequestTooLong(EngineError):
    """Prompt plus max_tokens exceeds the model context or the KV pool."""

    error_type = "request_too_long"


class InvalidRequest(EngineError):
    """A request field is out of range (bad sampling value, empty prompt, unknown token id)."""

    error_type = "invalid_request"


class KVCacheExhausted(EngineError):
    """No pages could be freed for a request even after eviction and preemption."""

    error_type = "kv_cache_exhausted"


class UnknownParent(EngineError):
    """The parent turn's KV is not held by this engine; resend the full token path."""

    error_type = "unknown_parent"


class EngineShutdown(EngineError):
    """The engine stopped while the request was in flight."""

    error_type = "engine_shutdown"


class InvalidParallelism(InvalidRequest):
    """A tensor-parallel size (`--tp`) the model or the engine's other options cannot be split
    by; raised at start, before any rank is spawned."""


class InvalidToolSchema(InvalidRequest):
    """A tool's arguments schema is not a JSON object schema the grammar backend can compile."""

    error_type = "invalid_tool_schema"


class InvalidDraftHead(InvalidRequest):
    """A draft head given with `--spec` cannot serve this target: its files are missing or
    damaged, or its config or tensors do not fit the target. Raised at start; the message names
    the file and the field or tensor, with the expected and the actual value."""
