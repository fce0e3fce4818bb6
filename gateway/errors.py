"""Every error the gateway answers with, mapped to HTTP in exactly one place.

Body: `{"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}`. The same body
is the `data` of an SSE `error` event when a streamed turn fails mid-way (`error_body`).

The compatible routes answer in their API's own envelope (`dialect_of` picks it by path, and for
`GET /v1/models` by the `anthropic-version` header; `wire_error` builds it): Anthropic
`{"type": "error", "error": {"type": <Anthropic ErrorType>, "message"}}` (overload is 529) and
OpenAI `{"error": {"message", "type", "param", "code": <our error type>}}`. Both answer 400 where
the native API answers 422 for a malformed body.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import EngineError
from engine.errors import InvalidRequest as InvalidRequest  # one definition each, the engine's
from engine.errors import InvalidToolSchema as InvalidToolSchema
from gateway.error_catalog import kind_of, retry_headers
from sessions import errors as se
from sessions import redis_client


class ConfigError(RuntimeError):
    """The gateway cannot start with this configuration (the message says what to change)."""


class ApiError(Exception):
    """An error raised by the gateway itself; its `error_type` (whose status is in
    `gateway.error_catalog`) goes on the wire."""

    error_type = "invalid_request"

    def __init__(self, message: str, *, error_type: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if error_type is not None:
            self.error_type = error_type

    def wire_headers(self, dialect: Dialect) -> dict[str, str]:
        """Headers this error adds to its HTTP answer in `dialect` (over the catalog's)."""
        return {}


class AuthenticationError(ApiError):
    error_type = "authentication_error"


class RequestTooLarge(ApiError):
    error_type = "request_too_large"


class InFlight(ApiError):
    """An idempotent retry arrived while the first request with that key is still running."""

    error_type = "conflict"


class UnknownModel(ApiError):
    """A compatible request names a model that neither is served nor matches an alias."""

    error_type = "unknown_model"


class EngineUnavailable(ApiError):
    error_type = "engine_unavailable"


class StoreUnavailable(ApiError):
    """The session store (Redis/Valkey) does not answer; `serve` restarts an embedded one."""

    error_type = "store_unavailable"


class Overloaded(ApiError):
    """The engine's queue would hold a new turn longer than `--max-queue-wait` (load shed:
    503, Anthropic's 529), with a `Retry-After` of the estimated excess."""

    error_type = "overloaded"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def wire_headers(self, dialect: Dialect) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class EngineFailure(ApiError):
    """The engine answered `Failed`; `error_type` is the engine's (e.g. request_too_long)."""

    error_type = "engine_error"


def is_store_outage(exc: BaseException) -> bool:
    """True for a Redis error that means the store is down or not ready (a connection error,
    a timeout, LOADING, a cluster failing over...), as opposed to a bug in a command
    (`sessions.redis_client.is_store_outage`)."""
    return redis_client.is_store_outage(exc)


def status_for(exc: Exception) -> tuple[int, str]:
    """(HTTP status, error type) of any exception; unknown ones are 500 `api_error`."""
    if isinstance(exc, ApiError | se.SessionError | EngineError):
        return kind_of(exc.error_type).status, exc.error_type
    if is_store_outage(exc):
        return 503, StoreUnavailable.error_type
    return 500, "api_error"


def error_message(exc: Exception, error_type: str) -> str:
    """The message a client sees: an internal error's text is never shown."""
    if error_type == "api_error":
        return "internal error"
    if error_type == StoreUnavailable.error_type and not isinstance(exc, ApiError):
        return "the session store is unavailable; retry shortly"
    return str(exc)




def error_body(error_type: str, message: str, request_id: str | None) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message},
            "request_id": request_id}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """A route's OpenAPI `responses` for these error statuses (bodies from `error_body`)."""
    return {code: {"description": "error body {type: error, error: {type, message}, "
                                  "request_id}"} for code in codes}


Dialect = Literal["native", "openai", "anthropic"]
_ANTHROPIC_TYPES: Mapping[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
    504: "timeout_error", 529: "overloaded_error"}
_OPENAI_TYPES: Mapping[int, str] = {
    401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
_OPENAI_CODES: Mapping[str, str] = {"request_too_long": "context_length_exceeded",
                                    "rate_limit_error": "rate_limit_exceeded",
                                    "unknown_model": "model_not_found"}


def dialect_of(path: str, headers: Mapping[str, str]) -> Dialect:
    """Which API's error envelope a request gets (`headers` with lower-case names)."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith(("/v1/chat/completions", "/v1/responses", "/v1/conversations")):
        return "openai"
    if path == "/v1/models" or path.startswith("/v1/models/"):
        return "anthropic" if "anthropic-version" in headers else "openai"
    return "native"


def wire_error(dialect: Dialect, status: int, error_type: str, message: str,
               request_id: str | None, param: str | None = None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of an error in `dialect`'s envelope; also the data of a streamed
    error frame. `param`: the request field at fault (OpenAI's body names it)."""
    if dialect == "native":
        return status, error_body(error_type, message, request_id)
    if status == 422:
        status = 400
    if dialect == "anthropic":
        status = 529 if status == 503 else status
        if error_type == "request_too_long":
            message = f"prompt is too long: {message}"
        kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else
                                    "invalid_request_error")
        return status, {"type": "error", "error": {"type": kind, "message": message},
                        "request_id": request_id}
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else
                             "invalid_request_error")
    return status, {"error": {"message": message, "type": kind, "param": param,
                              "code": _OPENAI_CODES.get(error_type, error_type)}}


def exception_error(dialect: Dialect, exc: Exception, request_id: str | None
                    ) -> tuple[int, dict[str, Any]]:
    """`wire_error` of any exception (unknown ones are a 500 saying only "internal error")."""
    status, error_type = status_for(exc)
    return wire_error(dialect, status, error_type, error_message(exc, error_type), request_id,
                      param_of(exc))


def param_of(exc: BaseException) -> str | None:
    """The request field an error names (`param=` of ApiError and EngineError), if any."""
    param = getattr(exc, "param", None)
    return param if isinstance(param, str) else None


def request_id_of(request: Request) -> str | None:
    value = request.scope.get("state", {}).get("request_id")
    return value if isinstance(value, str) else None


def _respond(request: Request, status: int, error_type: str, message: str,
             extra: Mapping[str, Any] | None = None, param: str | None = None,
             exc: Exception | None = None) -> JSONResponse:
    dialect = dialect_of(request.url.path, request.headers)
    status, body = wire_error(dialect, status, error_type, message, request_id_of(request),
                              param)
    if extra and dialect == "native":
        body["error"].update(extra)
    headers = retry_headers(error_type, status)
    if isinstance(exc, ApiError):
        own = exc.wire_headers(dialect)
        if any(name.lower() == "retry-after" for name in own):
            headers.pop("Retry-After", None)
        headers.update(own)
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, headers=headers)


async def _on_known(request: Request, exc: Exception) -> JSONResponse:
    status, error_type = status_for(exc)
    extra: dict[str, Any] = {}
    if isinstance(exc, se.HeadMoved):
        extra = {"current_head": exc.current_head, "version": exc.version}
    elif isinstance(exc, se.VersionConflict):
        extra = {"version": exc.current}
    return _respond(request, status, error_type, error_message(exc, error_type), extra,
                    param_of(exc), exc)


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    message = f"{where}: {first.get('msg', 'invalid request')}" if where else "invalid request"
    return _respond(request, 422, "validation_error", message,
                    {"details": [{"loc": list(e.get("loc", ())), "msg": e.get("msg")}
                                 for e in errors[:20]]}, _param_of_loc(first.get("loc", ())))


def _param_of_loc(loc: Any) -> str | None:
    """OpenAI's `param` of a validation error: `input[0].call_id` for ("body", "input", 0,
    "call_id")."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _respond(request, exc.status_code, error_type, str(exc.detail))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    status, error_type = status_for(exc)  # a store outage is a 503, anything else a 500
    return _respond(request, status, error_type, error_message(exc, error_type))


def install_error_handlers(app: FastAPI) -> None:
    """The one exception-handler table of the gateway."""
    app.add_exception_handler(ApiError, _on_known)
    app.add_exception_handler(se.SessionError, _on_known)
    app.add_exception_handler(EngineError, _on_known)
    app.add_exception_handler(RedisError, _on_known)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(Exception, _on_unexpected)
