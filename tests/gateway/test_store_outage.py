"""A session store that does not answer is a typed 503 with Retry-After on every route and
dialect (never a 500), and /readyz says so; the finished reply's write rides out a short outage."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from redis.exceptions import BusyLoadingError, ConnectionError, ResponseError

from gateway.errors import is_store_outage, status_for
from gateway.worker import free_port
from tests.gateway.conftest import Harness

USER = {"messages": [{"role": "user", "content": "hi"}], "generate": {"max_tokens": 3}}


@pytest.mark.parametrize(("exc", "outage"), [
    (ConnectionError("Connection refused"), True),
    (BusyLoadingError("Valkey is loading the dataset in memory"), True),
    (ResponseError("LOADING Valkey is loading the dataset in memory"), True),
    (ResponseError("READONLY You can't write against a read only replica."), True),
    (ResponseError("ERR Error running script"), False),
    (ValueError("not redis"), False),
])
def test_store_outage_classification(exc: Exception, outage: bool) -> None:
    assert is_store_outage(exc) is outage
    assert status_for(exc) == ((503, "store_unavailable") if outage else (500, "api_error"))


def test_dead_store_is_a_typed_503_everywhere(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        for method, path, payload in [("POST", "/v1/sessions", {}),
                                      ("GET", "/v1/sessions/abc", None),
                                      ("POST", "/v1/sessions/abc/turns", USER)]:
            r = await c.request(method, path, json=payload)
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "store_unavailable"
        r = await c.post("/v1/chat/completions", json={
            "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        r = await c.post("/v1/messages", json={
            "model": "claude-sonnet-4", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
        assert r.headers["retry-after"] == "1"
        ready = await c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["redis"] is False
        assert ready.json()["engine"] is True

    run_gateway(body, redis_url=f"redis://127.0.0.1:{free_port()}/0")
