"""The SDK's error hierarchy. Status → class is one dict (`STATUS_ERRORS`), used by both
clients and by the stream (an SSE `error` event raises the same classes as an HTTP error).

    RadixgateError
    └─ APIError(message, request, body)
       ├─ APIStatusError(status_code, error_type, request_id, body)
       │    └─ BadRequestError 400, AuthenticationError 401, NotFoundError 404, ConflictError 409,
       │       PreconditionFailedError 412, RequestTooLargeError 413,
       │       UnprocessableEntityError 422, RateLimitError 429, InternalServerError 5xx
       └─ APIConnectionError
            └─ APITimeoutError
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import httpx


class RadixgateError(Exception):
    pass


class APIError(RadixgateError):
    def __init__(self, message: str, request: httpx.Request | None, *,
                 body: object | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.request = request
        self.body = body


class APIStatusError(APIError):
    """The server answered 4xx/5xx, or a stream ended with an `error` event."""

    status_code: int

    def __init__(self, message: str, *, status_code: int, error_type: str | None,
                 request_id: str | None, body: object | None,
                 request: httpx.Request | None = None,
                 response: httpx.Response | None = None) -> None:
        super().__init__(message, request, body=body)
        self.status_code = status_code
        self.error_type = error_type
        self.request_id = request_id
        self.response = response

    def __str__(self) -> str:
        return f"{self.status_code} {self.error_type}: {self.message} (request {self.request_id})"


class BadRequestError(APIStatusError):
    status_code: Literal[400] = 400


class AuthenticationError(APIStatusError):
    status_code: Literal[401] = 401


class NotFoundError(APIStatusError):
    status_code: Literal[404] = 404


class ConflictError(APIStatusError):
    status_code: Literal[409] = 409


class PreconditionFailedError(APIStatusError):
    status_code: Literal[412] = 412


class RequestTooLargeError(APIStatusError):
    status_code: Literal[413] = 413


class UnprocessableEntityError(APIStatusError):
    status_code: Literal[422] = 422


class RateLimitError(APIStatusError):
    status_code: Literal[429] = 429


class InternalServerError(APIStatusError):
    pass


class APIConnectionError(APIError):
    def __init__(self, request: httpx.Request | None, message: str = "connection error") -> None:
        super().__init__(message, request)


class APITimeoutError(APIConnectionError):
    def __init__(self, request: httpx.Request | None) -> None:
        super().__init__(request, "request timed out")


STATUS_ERRORS: Mapping[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    412: PreconditionFailedError,
    413: RequestTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}

TURN_INTERRUPTED = "turn_interrupted"


def error_class(status_code: int) -> type[APIStatusError]:
    if status_code in STATUS_ERRORS:
        return STATUS_ERRORS[status_code]
    return InternalServerError if status_code >= 500 else APIStatusError


def _error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """(error type, message, request id) of an error body, each None when absent."""
    if not isinstance(body, Mapping):
        return None, None, None
    error: Any = body.get("error")
    error_type = error.get("type") if isinstance(error, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else None
    request_id = body.get("request_id")
    return (error_type if isinstance(error_type, str) else None,
            message if isinstance(message, str) else None,
            request_id if isinstance(request_id, str) else None)


def make_status_error(status_code: int, body: object, *, request_id: str | None = None,
                      request: httpx.Request | None = None,
                      response: httpx.Response | None = None) -> APIStatusError:
    """The typed error of a status and a decoded body (JSON, else raw text, else None)."""
    error_type, message, body_request_id = _error_fields(body)
    if message is None:
        message = body if isinstance(body, str) and body else f"HTTP {status_code}"
    cls = error_class(status_code)
    return cls(message, status_code=status_code, error_type=error_type,
               request_id=body_request_id or request_id, body=body, request=request,
               response=response)


def error_from_response(response: httpx.Response) -> APIStatusError:
    """Needs a read response (`response.read()` / `await response.aread()`)."""
    try:
        body: object = response.json()
    except ValueError:
        body = response.text or None
    return make_status_error(response.status_code, body,
                             request_id=response.headers.get("x-request-id"),
                             request=response.request, response=response)


def error_from_event(data: Mapping[str, Any], request: httpx.Request | None) -> APIStatusError:
    """The error an SSE `error` event stands for, with the HTTP status its payload names (the
    server's error catalog; 500 when a server sends none)."""
    error = data.get("error")
    status = error.get("status") if isinstance(error, Mapping) else None
    return make_status_error(status if isinstance(status, int) else 500, dict(data),
                             request=request)


def is_continuable(exc: APIStatusError) -> bool:
    """A stream error after which the same request (same Idempotency-Key) continues the turn
    where it stopped: its engine worker restarted mid-stream."""
    return exc.error_type == TURN_INTERRUPTED
