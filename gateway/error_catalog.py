"""The one table of error types: each type's HTTP status and whether a retry can succeed.

Every error the gateway answers with has an `error_type` (the gateway's own, the session
store's, the engine's); this table is the only place that maps them to HTTP. HTTP answers carry
the status, `Retry-After` where a wait helps, and `x-should-retry` (which the official SDKs and
ours obey) where the status alone would mislead a client's retry policy; an SSE `error` event
carries `status` and `retryable` in its payload (`gateway.errors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ErrorKind:
    status: int
    retryable: bool = False  # may the very same request succeed later?
    retry_after_s: int | None = None  # how long to wait first (a `Retry-After` header)


_NOT_FOUND: Final = ErrorKind(404)
_BAD: Final = ErrorKind(400)
_CONFLICT: Final = ErrorKind(409)  # retrying the same request cannot succeed: rebase first

CATALOG: Final[Mapping[str, ErrorKind]] = {
    # the gateway's
    "invalid_request": _BAD,
    "invalid_tool_schema": _BAD,
    "validation_error": ErrorKind(422),
    "authentication_error": ErrorKind(401),
    "not_found": _NOT_FOUND,
    "method_not_allowed": ErrorKind(405),
    "http_error": _BAD,
    "request_too_large": ErrorKind(413),
    "conflict": ErrorKind(409, retryable=True, retry_after_s=1),  # the key's request runs
    "unknown_model": _NOT_FOUND,
    "previous_response_not_found": _BAD,  # OpenAI's code for an unknown previous_response_id
    "engine_unavailable": ErrorKind(503, retryable=True, retry_after_s=5),
    "store_unavailable": ErrorKind(503, retryable=True, retry_after_s=1),
    "turn_interrupted": ErrorKind(503, retryable=True, retry_after_s=1),
    "api_error": ErrorKind(500, retryable=True),
    "rate_limit_error": ErrorKind(429, retryable=True),  # Retry-After from the limit's window
    "overloaded": ErrorKind(503, retryable=True, retry_after_s=1),  # load shed (Anthropic: 529)
    # the session store's
    "session_not_found": _NOT_FOUND,
    "turn_not_found": _NOT_FOUND,
    "branch_not_found": _NOT_FOUND,
    "branch_exists": _CONFLICT,
    "head_moved": _CONFLICT,
    "branch_busy": _CONFLICT,
    "version_conflict": ErrorKind(412),
    "idempotency_conflict": ErrorKind(422),
    "invalid_tree_operation": _BAD,
    "store_corruption": ErrorKind(500),
    "session_error": ErrorKind(500),
    # the engine's
    "request_too_long": _BAD,
    "kv_cache_exhausted": ErrorKind(503, retryable=True, retry_after_s=2),
    "engine_shutdown": ErrorKind(503, retryable=True, retry_after_s=5),
    "unknown_parent": ErrorKind(503, retryable=True, retry_after_s=1),
    "engine_error": ErrorKind(500, retryable=True),
    "model_not_found": ErrorKind(500),
    "unsupported_model": ErrorKind(500),
}
_UNKNOWN: Final = ErrorKind(500, retryable=True)


def kind_of(error_type: str) -> ErrorKind:
    """The kind of `error_type`; an unknown type is a retryable 500."""
    return CATALOG.get(error_type, _UNKNOWN)


def retry_headers(error_type: str, status: int) -> dict[str, str]:
    """`Retry-After` where a wait helps, and `x-should-retry` where clients would otherwise
    guess wrong: retry policies retry 408/409/429/5xx, so a 409 that cannot succeed says
    false, and a retryable error says true. (`status` may differ from the kind's: Anthropic's
    overload is 529.)"""
    kind = kind_of(error_type)
    headers: dict[str, str] = {}
    if kind.retry_after_s is not None:
        headers["Retry-After"] = str(kind.retry_after_s)
    if status in (408, 409, 429) or status >= 500:
        headers["x-should-retry"] = "true" if kind.retryable else "false"
    return headers
