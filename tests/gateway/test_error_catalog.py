"""One error catalog: every error type the engine, the session store and the gateway define has
its status there; HTTP answers carry `x-should-retry` and `Retry-After` from it, and so do the
official clients' retry decisions."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType

import pytest

import engine.errors
import gateway.errors
import gateway.generation
import sessions.errors
from gateway.error_catalog import CATALOG, kind_of, retry_headers
from tests.gateway.conftest import Harness


def _error_types(module: ModuleType) -> set[str]:
    return {cls.error_type for _, cls in inspect.getmembers(module, inspect.isclass)
            if isinstance(getattr(cls, "error_type", None), str)}


@pytest.mark.parametrize("module", [engine.errors, sessions.errors, gateway.errors,
                                    gateway.generation])
def test_every_error_type_is_in_the_catalog(module: ModuleType) -> None:
    missing = _error_types(module) - set(CATALOG)
    assert not missing, f"{module.__name__} defines error types without a status: {missing}"


def test_retry_headers_follow_the_catalog() -> None:
    assert retry_headers("head_moved", 409) == {"x-should-retry": "false"}
    assert retry_headers("conflict", 409) == {"Retry-After": "1", "x-should-retry": "true"}
    assert retry_headers("store_unavailable", 529) == {"Retry-After": "1",
                                                       "x-should-retry": "true"}
    assert retry_headers("invalid_request", 400) == {}
    assert kind_of("brand_new_type").status == 500


def test_http_answers_say_whether_to_retry(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        ok = await c.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "hi"}], "generate": {"max_tokens": 2}})
        r = await c.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "hi"}], "generate": {"max_tokens": 2},
            "branch": "main", "parent_turn_id": ok.json()["parent_id"]})
        assert r.status_code == 409 and r.json()["error"]["type"] == "head_moved"
        assert r.headers["x-should-retry"] == "false"
        r = await c.post(f"/v1/sessions/{sid}/fork",
                         json={"from_turn_id": ok.json()["id"], "branch": "main"})
        assert r.status_code == 409 and r.headers["x-should-retry"] == "false"

    run_gateway(body)
