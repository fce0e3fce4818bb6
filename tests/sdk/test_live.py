"""The SDK against a live gateway (uvicorn on a free port): one test body per behaviour, run for
both `Client` and `AsyncClient`. `call` awaits only what the async twin returns."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

import sdk
from tests.sdk.conftest import MAX_BODY_BYTES
from tests.sdk.test_client_unit import call, collect

TWINS = pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
GEN: dict[str, Any] = {"max_tokens": 6}


def client_for(sync: bool, base_url: str, **kwargs: Any) -> sdk.Client | sdk.AsyncClient:
    return sdk.Client(base_url, **kwargs) if sync else sdk.AsyncClient(base_url, **kwargs)


@TWINS
def test_create_append_stream_fork_rewind(sync: bool, live_server: str) -> None:
    async def body() -> None:
        client = client_for(sync, live_server)
        session = await call(client.sessions.create(system="Be brief."))
        root = session.head_turn_id
        t1 = await call(session.append("hello", **GEN))
        assert t1.role == "assistant" and t1.branch == "main" and session.head_turn_id == t1.id
        assert t1.usage is not None and t1.usage.output_tokens >= 1
        assert t1.usage.input_tokens == t1.usage.cached_tokens + t1.usage.computed_tokens
        texts, t2 = await collect(session.stream("and then?", **GEN))
        assert "".join(texts) == t2.content and t2.usage is not None
        assert t2.usage.cached_tokens > 0 and session.head_turn_id == t2.id
        assert (await call(session.get_turn(t2.id))).content == t2.content
        forked = await call(session.fork(t1.id, "alt"))
        assert forked.branches == {"main": t2.id, "alt": t1.id}
        alt = await call(session.append("other way", branch="alt", **GEN))
        assert alt.branch == "alt" and alt.usage is not None and alt.usage.cached_tokens > 0
        assert session.head_turn_id == t2.id  # the handle follows its own branch only
        rewound = await call(session.rewind("main", t1.id))
        assert rewound.branches["main"] == t1.id == session.head_turn_id
        state = await call(session.refresh())
        assert state.branches == {"main": t1.id, "alt": alt.id}
        assert state.root_turn_id == root and session.version == state.version
        again = await call(client.sessions.get(session.id))
        assert again.head_turn_id == t1.id and again.state is not None
        await call(session.delete())
        with pytest.raises(sdk.NotFoundError):
            await call(client.sessions.get(session.id))
        await call(client.close())

    asyncio.run(body())


class _Flaky:
    """Answers the first request with a 503 itself and records every Idempotency-Key."""

    def __init__(self) -> None:
        self.keys: list[str | None] = []

    def intercept(self, request: httpx.Request) -> httpx.Response | None:
        self.keys.append(request.headers.get("idempotency-key"))
        if len(self.keys) > 1:
            return None
        return httpx.Response(503, headers={"retry-after-ms": "10"}, json={
            "type": "error", "error": {"type": "engine_unavailable", "message": "injected"},
            "request_id": "req_injected"})


class _FlakySync(httpx.BaseTransport):
    def __init__(self, flaky: _Flaky) -> None:
        self.flaky, self.inner = flaky, httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.flaky.intercept(request) or self.inner.handle_request(request)


class _FlakyAsync(httpx.AsyncBaseTransport):
    def __init__(self, flaky: _Flaky) -> None:
        self.flaky, self.inner = flaky, httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self.flaky.intercept(request) or await self.inner.handle_async_request(request)


@TWINS
def test_retry_after_503_reuses_the_idempotency_key(sync: bool, live_server: str) -> None:
    async def body() -> None:
        plain = client_for(sync, live_server)
        session = await call(plain.sessions.create())
        flaky = _Flaky()
        http: httpx.Client | httpx.AsyncClient = (
            httpx.Client(transport=_FlakySync(flaky)) if sync
            else httpx.AsyncClient(transport=_FlakyAsync(flaky)))
        client = client_for(sync, live_server, http_client=http)
        handle = await call(client.sessions.get(session.id))
        flaky.keys.clear()
        turn = await call(handle.append("retry me", **GEN))
        assert len(flaky.keys) == 2 and flaky.keys[0] is not None
        assert flaky.keys[0] == flaky.keys[1]
        state = await call(handle.refresh())
        assert [t.role for t in state.turns] == ["root", "user", "assistant"]
        assert state.branches["main"] == turn.id
        await call(client.close())
        await call(plain.close())

    asyncio.run(body())


@TWINS
def test_typed_errors(sync: bool, live_server: str) -> None:
    async def body() -> None:
        client = client_for(sync, live_server, max_retries=0)
        with pytest.raises(sdk.NotFoundError) as not_found:
            await call(client.sessions.get("nope"))
        assert not_found.value.error_type == "session_not_found"
        assert not_found.value.request_id and not_found.value.status_code == 404
        session = await call(client.sessions.create())
        turn = await call(session.append("hi", max_tokens=2))
        with pytest.raises(sdk.ConflictError) as conflict:
            await call(session.fork(turn.id, "main"))
        assert conflict.value.error_type == "branch_exists"
        with pytest.raises(sdk.PreconditionFailedError) as stale:
            await call(session.append("hi", if_match=1, max_tokens=2))
        assert stale.value.error_type == "version_conflict"
        with pytest.raises(sdk.RequestTooLargeError) as large:
            await call(session.append("x" * MAX_BODY_BYTES, max_tokens=2))
        assert large.value.error_type == "request_too_large"
        with pytest.raises(sdk.UnprocessableEntityError):
            await call(session.append([], max_tokens=2))
        await call(client.close())

    asyncio.run(body())
