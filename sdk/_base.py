"""Sync-agnostic client logic as pure functions: request building, the retry policy, response
parsing and stream accumulation. `Client` and `AsyncClient` only add I/O around these."""

from __future__ import annotations

import email.utils
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from pydantic import ValidationError

from sdk._constants import (
    IDEMPOTENCY_HEADER,
    INITIAL_RETRY_DELAY,
    LAST_EVENT_ID_HEADER,
    MAX_RETRY_AFTER,
    MAX_RETRY_DELAY,
)
from sdk._errors import APIConnectionError, APITimeoutError, error_from_event
from sdk._sse import ServerSentEvent
from sdk._toolcalls import ToolCallSnapshot, accumulate_tool_call
from sdk._tracing import inject_trace_headers
from sdk.types import (
    KNOWN_EVENTS,
    STREAM_EVENT_ADAPTER,
    ErrorEvent,
    GenerateParams,
    Message,
    MessageParam,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Turn,
    TurnEnd,
    TurnStart,
)

RETRY_STATUSES = frozenset({408, 409, 429})
MessagesInput = str | Sequence[MessageParam | Message | Mapping[str, Any]]


@dataclass(frozen=True)
class RequestOptions:
    """One logical request. `idempotency_key` is fixed before the first attempt and reused by
    every retry of it."""

    method: str
    path: str
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    stream: bool = False


def new_idempotency_key() -> str:
    return f"rg-sdk-{uuid.uuid4().hex}"


def make_options(method: str, path: str, *, json: Any = None, if_match: int | str | None = None,
                 idempotency_key: str | None = None, stream: bool = False) -> RequestOptions:
    """Every non-GET request gets one idempotency key (the caller's, else a fresh one)."""
    headers: dict[str, str] = {}
    if if_match is not None:
        headers["If-Match"] = f'"v{if_match}"' if isinstance(if_match, int) else if_match
    if stream:
        headers["Accept"] = "text/event-stream"
    if method != "GET" and idempotency_key is None:
        idempotency_key = new_idempotency_key()
    return RequestOptions(method, path, json, headers, idempotency_key, stream)


def continue_options(options: RequestOptions, last_event_id: str | None) -> RequestOptions:
    """The same streamed request again (same body, same Idempotency-Key), to continue a turn
    whose stream was interrupted after event `last_event_id`."""
    headers = dict(options.headers)
    if last_event_id is not None:
        headers[LAST_EVENT_ID_HEADER] = last_event_id
    return replace(options, headers=headers)


def default_headers(api_key: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": "radixgate-sdk/0.1"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def build_request(client: httpx.Client | httpx.AsyncClient,
                  options: RequestOptions) -> httpx.Request:
    """One attempt's request. Built per attempt, so each carries the `traceparent` of the span
    current when it is sent (none without opentelemetry)."""
    headers = dict(options.headers)
    if options.idempotency_key is not None:
        headers[IDEMPOTENCY_HEADER] = options.idempotency_key
    inject_trace_headers(headers)
    return client.build_request(options.method, options.path, json=options.json,
                                headers=headers)


# ---- retry policy ----------------------------------------------------------------------------


def should_retry(status_code: int, headers: Mapping[str, str]) -> bool:
    """`x-should-retry` first; then 408/409/429/5xx."""
    explicit = headers.get("x-should-retry")
    if explicit in ("true", "false"):
        return explicit == "true"
    return status_code in RETRY_STATUSES or status_code >= 500


def parse_retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the server asks us to wait (`retry-after-ms`, then `retry-after` as seconds or
    an HTTP date), or None when absent or unparseable."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return float(raw_ms) / 1000.0
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(raw)
    if parsed is None:
        return None
    return float(email.utils.mktime_tz(parsed)) - now


def retry_delay(attempt: int, headers: Mapping[str, str] | None, *, now: float | None = None,
                jitter: float | None = None) -> float:
    """Seconds to sleep before retry number `attempt + 1` (`attempt` counts from 0).

    A server-requested wait in (0, 60] s wins; otherwise `min(0.5 * 2**attempt, 8)` scaled by a
    jitter factor in (0.75, 1] (`jitter` is the random draw in [0, 1), for tests)."""
    if headers is not None:
        after = parse_retry_after(headers, time.time() if now is None else now)
        if after is not None and 0 < after <= MAX_RETRY_AFTER:
            return after
    base = min(INITIAL_RETRY_DELAY * 2.0 ** min(attempt, 30), MAX_RETRY_DELAY)
    draw = random.random() if jitter is None else jitter
    return base * (1 - 0.25 * draw)


def retry_decision(attempt: int, max_retries: int, status_code: int | None,
                   headers: Mapping[str, str] | None) -> float | None:
    """Delay before retrying a failed attempt, or None to give up. `status_code` None means a
    connection error or timeout (always retryable)."""
    if attempt >= max_retries:
        return None
    if status_code is not None and not should_retry(status_code, headers or {}):
        return None
    return retry_delay(attempt, headers)


def transport_error(exc: httpx.TransportError, request: httpx.Request) -> APIConnectionError:
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(request)
    return APIConnectionError(request, f"connection error: {exc}")


# ---- bodies ----------------------------------------------------------------------------------


def messages_body(messages: MessagesInput) -> list[dict[str, Any]]:
    """A plain string is one user message."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [m.model_dump(exclude_none=True) if isinstance(m, Message) else dict(m)
            for m in messages]


def append_body(messages: MessagesInput, generate: GenerateParams, *, stream: bool,
                branch: str | None, parent_turn_id: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages_body(messages),
                            "generate": {**generate, "stream": stream}}
    if parent_turn_id is not None:
        body["parent_turn_id"] = parent_turn_id
    if branch is not None:
        body["branch"] = branch
    return body


# ---- stream accumulation ---------------------------------------------------------------------


@dataclass(frozen=True)
class TurnSnapshot:
    """What a stream has shown so far. `tool_calls`: every call started, in order."""

    text: str = ""
    tool_calls: tuple[ToolCallSnapshot, ...] = ()
    input_turn_id: str | None = None
    parent_turn_id: str | None = None
    turn: Turn | None = None
    last_event_id: str | None = None
    num_events: int = 0


def parse_event(sse: ServerSentEvent, request: httpx.Request | None) -> StreamEvent | None:
    """The typed event of an SSE frame; None for unknown event types (skipped, for forward
    compatibility). Raises the matching APIStatusError for an `error` event."""
    if sse.event not in KNOWN_EVENTS:
        return None
    try:
        event = STREAM_EVENT_ADAPTER.validate_json(sse.data)
    except ValidationError:
        if sse.event == "error":
            raise error_from_event({"error": {"type": "api_error", "message": sse.data}},
                                   request) from None
        raise
    if isinstance(event, ErrorEvent):
        raise error_from_event(event.model_dump(), request)
    return event


def accumulate_event(snapshot: TurnSnapshot, event: StreamEvent,
                     event_id: str | None) -> TurnSnapshot:
    """The snapshot after `event`. Pure: `snapshot` is not changed."""
    snapshot = replace(snapshot, last_event_id=event_id, num_events=snapshot.num_events + 1)
    if isinstance(event, TurnStart):
        return replace(snapshot, input_turn_id=event.input_turn_id,
                       parent_turn_id=event.parent_turn_id)
    if isinstance(event, TextDelta):
        return replace(snapshot, text=snapshot.text + event.text)
    if isinstance(event, ToolCallStart | ToolCallDelta | ToolCallEnd):
        return replace(snapshot, tool_calls=accumulate_tool_call(snapshot.tool_calls, event))
    if isinstance(event, TurnEnd):
        turn = event.turn
        done = [c.to_dict() for c in snapshot.tool_calls if c.is_done]
        if done and not turn.tool_calls:  # a server that sent the calls only as events
            turn = turn.model_copy(update={"tool_calls": done})
        return replace(snapshot, turn=turn)
    return snapshot
