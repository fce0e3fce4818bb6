"""`GET /v1/sessions/{id}/events`: the session's event stream over SSE.

Two sources merged into one stream:
- the store's events (`sessions.SessionReader.read_events`), with their stream ids as SSE ids,
  so `Last-Event-ID` (or `?after=`) resumes where a reader left off: session.created,
  turns.appended, branch.created, branch.moved;
- this gateway's generation events (`gateway.live_turns`), without ids (a reconnect cannot
  replay them): generation.started, generation.delta, generation.ended.
A deleted session ends the stream with `session.deleted`: at once when the delete passed through
this gateway, else within `POLL_MS` (the store's stream of a deleted session just stays empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse

from gateway.deps import SessionStoreDep, TelemetryDep, TenantDep
from gateway.error_catalog import kind_of
from gateway.errors import (
    InvalidRequest,
    error_body,
    error_message,
    error_responses,
    status_for,
)
from gateway.keepalive import SSE_COMMENT_PING, keepalive
from gateway.live_turns import LiveTurns
from gateway.views import SSE_HEADERS
from sessions import SessionEvent, SessionNotFound, SessionStore

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
POLL_MS = 2000  # how long one blocking read of the store's stream waits
PAGE = 500
_STREAM_ID = re.compile(r"^\d+(-\d+)?$")
DELETED = {"type": "session.deleted"}


def event_data(event: SessionEvent) -> dict[str, Any]:
    """A stored event as JSON: its fields, `version` as a number, `turn_ids` as a list."""
    data: dict[str, Any] = {"type": event.type, **event.fields}
    if "version" in data:
        data["version"] = int(data["version"])
    if "turn_ids" in data:
        data["turn_ids"] = data["turn_ids"].split()
    return data


def _error(exc: Exception) -> dict[str, Any]:
    """An `error` event (a dead store, say): the reader reconnects with Last-Event-ID."""
    status, error_type = status_for(exc)
    body = error_body(error_type, error_message(exc, error_type), None)
    body["error"].update(status=status, retryable=kind_of(error_type).retryable)
    return {**body, "type": "error"}


def _frame(data: dict[str, Any], event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


async def event_frames(store: SessionStore, live: LiveTurns, session_id: str, tenant: str,
                       after: str) -> AsyncGenerator[bytes, None]:
    """The stored events after `after`, then stored and live events as they come. The replay
    reads without blocking, page by page, and the live events wait until it has caught up."""
    with live.subscribe(session_id) as queue:  # before the replay: nothing falls between
        cursor = after
        replaying = True
        stored: asyncio.Task[list[SessionEvent]] | None = None
        spoken: asyncio.Task[dict[str, Any]] | None = None
        try:
            while True:
                if stored is None:
                    stored = asyncio.ensure_future(store.read_events(
                        session_id, tenant=tenant, after=cursor, count=PAGE,
                        block_ms=None if replaying else POLL_MS))
                if spoken is None and not replaying:
                    spoken = asyncio.ensure_future(queue.get())
                await asyncio.wait([t for t in (stored, spoken) if t is not None],
                                   return_when=asyncio.FIRST_COMPLETED)
                if spoken is not None and spoken.done():
                    data, spoken = spoken.result(), None
                    yield _frame(data)
                    if data == DELETED:
                        return
                if stored.done():
                    task, stored = stored, None
                    try:
                        events = task.result()
                    except SessionNotFound:
                        yield _frame(DELETED)
                        return
                    except Exception as exc:  # noqa: BLE001 - the stream ends with a typed error
                        yield _frame(_error(exc))
                        return
                    for event in events:
                        yield _frame(event_data(event), event.id)
                        cursor = event.id
                    replaying = replaying and len(events) == PAGE
        finally:
            pending: list[asyncio.Future[Any]] = [t for t in (stored, spoken)
                                                  if t is not None and not t.done()]
            for future in pending:
                future.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await future


@router.get("/{session_id}/events", response_class=StreamingResponse, responses={
    200: {"content": {"text/event-stream": {}}},
    **error_responses(400, 401, 404, 503)})
async def session_events(session_id: str, request: Request, tenant: TenantDep,
                         store: SessionStoreDep, telemetry: TelemetryDep,
                         last_event_id: Annotated[str | None, Header()] = None,
                         after: str | None = None) -> StreamingResponse:
    """The session's events (see the module docstring); 404 before the stream for an unknown
    session or one of another tenant."""
    start = last_event_id or after or "0-0"
    if not _STREAM_ID.match(start):
        raise InvalidRequest(f"Last-Event-ID / after must be a stream id like 1712-0, not "
                             f"{start!r}")
    await store.get_session(session_id, tenant=tenant)
    frames = event_frames(store, telemetry.live, session_id, tenant, start)
    keepalive_s = request.state.settings.sse_keepalive_s
    return StreamingResponse(keepalive(frames, keepalive_s, SSE_COMMENT_PING),
                             media_type="text/event-stream", headers=SSE_HEADERS)
