"""Retry policy, error mapping and the twins' request loop over `httpx.MockTransport`.

Each client test body runs for both twins (`sync` parameter); `call` awaits only what the async
twin returns."""

from __future__ import annotations

import asyncio
import email.utils
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import sdk
from sdk._base import retry_decision, retry_delay, should_retry
from sdk._errors import error_class, make_status_error

FIXTURES = Path(__file__).parent / "fixtures"
NOW = 1_700_000_000.0
Handler = Callable[[httpx.Request], httpx.Response]


async def call(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def make_client(sync: bool, handler: Handler, **kwargs: Any) -> sdk.Client | sdk.AsyncClient:
    transport = httpx.MockTransport(handler)
    if sync:
        return sdk.Client("http://gw", http_client=httpx.Client(transport=transport), **kwargs)
    return sdk.AsyncClient("http://gw", http_client=httpx.AsyncClient(transport=transport),
                           **kwargs)


def error_response(status: int, error_type: str, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers={"x-request-id": "req_hdr", **headers},
                          json={"type": "error", "error": {"type": error_type, "message": "m"},
                                "request_id": "req_1"})


CREATED = {"id": "s1", "branch": "main", "head_turn_id": "r0", "version": 1}
FAST = {"retry-after-ms": "1"}


# ---- pure policy -----------------------------------------------------------------------------

@pytest.mark.parametrize(("attempt", "headers", "jitter", "expected"), [
    (0, {}, 0.0, 0.5),
    (1, {}, 0.0, 1.0),
    (3, {}, 0.0, 4.0),
    (4, {}, 0.0, 8.0),
    (40, {}, 0.0, 8.0),                                     # capped, no overflow
    (0, {}, 0.999, 0.5 * (1 - 0.25 * 0.999)),               # jitter shrinks, never grows
    (0, {"retry-after-ms": "250"}, 0.0, 0.25),
    (0, {"retry-after": "3"}, 0.0, 3.0),
    (0, {"retry-after-ms": "20", "retry-after": "3"}, 0.0, 0.02),  # -ms wins
    (2, {"retry-after": "61"}, 0.0, 2.0),                   # > 60 s: own backoff
    (2, {"retry-after": "0"}, 0.0, 2.0),                    # not positive: own backoff
    (2, {"retry-after": "-3"}, 0.0, 2.0),
    (2, {"retry-after": "soon"}, 0.0, 2.0),                 # unparseable
    (0, {"retry-after": email.utils.formatdate(NOW + 10, usegmt=True)}, 0.0, 10.0),
    (0, {"retry-after": email.utils.formatdate(NOW + 600, usegmt=True)}, 0.0, 0.5),
])
def test_retry_delay_table(attempt: int, headers: dict[str, str], jitter: float,
                           expected: float) -> None:
    assert retry_delay(attempt, httpx.Headers(headers), now=NOW, jitter=jitter) == \
        pytest.approx(expected)


@pytest.mark.parametrize(("status", "headers", "expected"), [
    (408, {}, True), (409, {}, True), (429, {}, True), (500, {}, True), (503, {}, True),
    (400, {}, False), (404, {}, False), (412, {}, False), (413, {}, False), (422, {}, False),
    (503, {"x-should-retry": "false"}, False), (400, {"x-should-retry": "true"}, True),
])
def test_should_retry(status: int, headers: dict[str, str], expected: bool) -> None:
    assert should_retry(status, httpx.Headers(headers)) is expected


def test_retry_decision_stops_at_max_retries() -> None:
    assert retry_decision(0, 2, None, None) is not None
    assert retry_decision(2, 2, None, None) is None
    assert retry_decision(0, 2, 404, httpx.Headers()) is None


@pytest.mark.parametrize(("status", "cls"), [
    (400, sdk.BadRequestError), (401, sdk.AuthenticationError), (404, sdk.NotFoundError),
    (409, sdk.ConflictError), (412, sdk.PreconditionFailedError),
    (413, sdk.RequestTooLargeError), (422, sdk.UnprocessableEntityError),
    (429, sdk.RateLimitError), (500, sdk.InternalServerError), (503, sdk.InternalServerError),
    (418, sdk.APIStatusError),
])
def test_status_maps_to_class(status: int, cls: type[sdk.APIStatusError]) -> None:
    assert error_class(status) is cls
    err = make_status_error(status, {"type": "error", "error": {"type": "t", "message": "why"},
                                     "request_id": "req_9"})
    assert type(err) is cls and isinstance(err, sdk.APIError)
    assert (err.status_code, err.error_type, err.message, err.request_id) == (
        status, "t", "why", "req_9")


def test_raw_body_and_hierarchy() -> None:
    err = make_status_error(502, "bad gateway", request_id="req_h")
    assert err.body == "bad gateway" and err.request_id == "req_h" and err.error_type is None
    assert issubclass(sdk.APITimeoutError, sdk.APIConnectionError)
    assert issubclass(sdk.APIConnectionError, sdk.APIError)
    assert issubclass(sdk.APIStatusError, sdk.RadixgateError)


# ---- the twins' request loop -----------------------------------------------------------------

@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_retry_reuses_one_idempotency_key(sync: bool) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) < 3:
            return error_response(503 if len(seen) == 1 else 429, "engine_unavailable", **FAST)
        return httpx.Response(201, json=CREATED)

    async def body() -> None:
        client = make_client(sync, handler)
        session = await call(client.sessions.create(system="hi"))
        assert (session.id, session.head_turn_id, session.version) == ("s1", "r0", 1)
        keys = {r.headers["idempotency-key"] for r in seen}
        assert len(seen) == 3 and len(keys) == 1 and keys.pop().startswith("rg-sdk-")
        session2 = await call(client.sessions.create(idempotency_key="mine"))
        assert session2.id == "s1" and seen[-1].headers["idempotency-key"] == "mine"
        await call(client.close())

    asyncio.run(body())


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_gives_up_after_max_retries_with_typed_error(sync: bool) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return error_response(500, "api_error", **FAST)

    async def body() -> None:
        client = make_client(sync, handler, max_retries=2)
        with pytest.raises(sdk.InternalServerError) as info:
            await call(client.sessions.create())
        assert len(seen) == 3 and info.value.request_id == "req_1"
        assert info.value.error_type == "api_error" and info.value.status_code == 500

    asyncio.run(body())


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_no_retry_on_4xx_or_should_retry_false(sync: bool) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "GET":
            assert "idempotency-key" not in request.headers
            return error_response(404, "session_not_found")
        return error_response(503, "engine_unavailable", **{"x-should-retry": "false"})

    async def body() -> None:
        client = make_client(sync, handler, api_key="rg-key")
        with pytest.raises(sdk.NotFoundError):
            await call(client.sessions.get("nope"))
        with pytest.raises(sdk.InternalServerError):
            await call(client.sessions.create())
        assert len(seen) == 2
        assert seen[0].headers["authorization"] == "Bearer rg-key"

    asyncio.run(body())


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize(("exc", "cls"), [(httpx.ConnectError("refused"), sdk.APIConnectionError),
                                          (httpx.ReadTimeout("slow"), sdk.APITimeoutError)])
def test_connection_errors_are_retried_then_typed(sync: bool, exc: Exception,
                                                  cls: type[Exception],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sdk._base.INITIAL_RETRY_DELAY", 0.001)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        raise exc

    async def body() -> None:
        client = make_client(sync, handler, max_retries=1)
        with pytest.raises(cls):
            await call(client.sessions.create())
        assert len(seen) == 2
        assert seen[0].headers["idempotency-key"] == seen[1].headers["idempotency-key"]

    asyncio.run(body())


async def collect(stream: sdk.TurnStream | sdk.AsyncTurnStream) -> tuple[list[str], sdk.Turn]:
    """The one sync/async fork of the stream tests: `with` vs `async with`."""
    if isinstance(stream, sdk.TurnStream):
        with stream as s:
            return list(s.text_stream), s.get_final_turn()
    async with stream as a:
        return [t async for t in a.text_stream], await a.get_final_turn()


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_stream_from_recorded_transcript(sync: bool) -> None:
    raw = (FIXTURES / "basic_turn.sse").read_bytes()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"id": "s1", "model": "m", "version": 2,
                                             "created_ms": 1, "root_turn_id": "r0",
                                             "default_branch": "main", "branches": {"main": "r0"},
                                             "future_field": 1})
        assert b'"stream":true' in request.content.replace(b" ", b"")
        return httpx.Response(200, content=raw, headers={"content-type": "text/event-stream"})

    async def body() -> None:
        client = make_client(sync, handler)
        session = await call(client.sessions.get("s1"))
        texts, turn = await collect(session.stream("hi", max_tokens=2))
        assert texts == ["Hel", "lo"] and turn.content == "Hello"
        assert turn.usage is not None and turn.usage.cached_tokens == 4
        assert session.head_turn_id == "a1" and session.version == 3

    asyncio.run(body())


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_stream_error_event_is_typed_and_never_retried(sync: bool) -> None:
    seen: list[httpx.Request] = []
    raw = (b'id: t:0\nevent: turn_start\ndata: {"type": "turn_start", "input_turn_id": "t"}\n\n'
           b'id: t:1\nevent: error\ndata: {"type": "error", "error": {"type": '
           b'"kv_cache_exhausted", "message": "full", "status": 503, "retryable": true}, '
           b'"request_id": "req_s"}\n\n')

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=raw, headers={"content-type": "text/event-stream"})

    async def body() -> None:
        client = make_client(sync, handler)
        session = sdk.Session if sync else sdk.AsyncSession
        handle = session(client, "s1")  # type: ignore[arg-type]
        with pytest.raises(sdk.InternalServerError) as info:
            await collect(handle.stream("hi"))
        assert info.value.error_type == "kv_cache_exhausted" and info.value.status_code == 503
        assert info.value.request_id == "req_s" and len(seen) == 1

    asyncio.run(body())


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_interrupted_stream_is_continued_with_the_same_key(sync: bool) -> None:
    """`turn_interrupted` (the worker restarted mid-stream): the same request again, with its
    Idempotency-Key and Last-Event-ID, and its events continue the one stream the caller sees."""
    seen: list[httpx.Request] = []
    lines = (FIXTURES / "basic_turn.sse").read_text().split("\n\n")
    head = "\n\n".join(lines[:3])  # turn_start, a comment, text_delta "Hel"
    interrupted = (head + '\n\nid: t1:2\nevent: error\ndata: {"type": "error", "error": '
                   '{"type": "turn_interrupted", "message": "worker restarted", "status": 503, '
                   '"retryable": true}, "request_id": "req_s"}\n\n')
    rest = "\n\n".join(lines[3:])  # ping, text_delta "lo", turn_end

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        raw = interrupted if len(seen) == 1 else rest
        return httpx.Response(200, content=raw.encode(),
                              headers={"content-type": "text/event-stream"})

    async def body() -> None:
        client = make_client(sync, handler)
        session = sdk.Session if sync else sdk.AsyncSession
        handle = session(client, "s1")  # type: ignore[arg-type]
        texts, turn = await collect(handle.stream("hi", max_tokens=2))
        assert texts == ["Hel", "lo"] and turn.content == "Hello"
        first, second = seen
        assert first.content == second.content
        assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
        assert "last-event-id" not in first.headers
        assert second.headers["last-event-id"] == "t1:1"

    asyncio.run(body())


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_stream_error_status_comes_from_the_event(sync: bool) -> None:
    raw = (b'id: t:0\nevent: turn_start\ndata: {"type": "turn_start", "input_turn_id": "t"}\n\n'
           b'id: t:1\nevent: error\ndata: {"type": "error", "error": {"type": '
           b'"some_new_type", "message": "m", "status": 409, "retryable": false}}\n\n')

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=raw, headers={"content-type": "text/event-stream"})

    async def body() -> None:
        session = sdk.Session if sync else sdk.AsyncSession
        handle = session(make_client(sync, handler), "s1")  # type: ignore[arg-type]
        with pytest.raises(sdk.ConflictError) as info:
            await collect(handle.stream("hi"))
        assert info.value.error_type == "some_new_type"

    asyncio.run(body())
