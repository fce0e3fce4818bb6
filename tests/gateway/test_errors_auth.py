"""Typed error bodies (412/409/422/413/400/401/404), tenants and idempotent replay."""

from __future__ import annotations

from collections.abc import Callable

from gateway.auth import KeyStore
from tests.gateway.conftest import Harness

USER = {"messages": [{"role": "user", "content": "hi"}], "generate": {"max_tokens": 3}}


def _error(r: object, status: int, error_type: str) -> None:
    assert r.status_code == status, r.text  # type: ignore[attr-defined]
    body = r.json()  # type: ignore[attr-defined]
    assert body["type"] == "error" and body["error"]["type"] == error_type, body
    assert body["request_id"] and body["error"]["message"]


def test_typed_errors(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        _error(await c.get("/v1/sessions/nope"), 404, "session_not_found")
        _error(await c.post(f"/v1/sessions/{sid}/turns", json=USER,
                            headers={"If-Match": '"v7"'}), 412, "version_conflict")
        ok = await c.post(f"/v1/sessions/{sid}/turns", json=USER, headers={"If-Match": '"v1"'})
        assert ok.status_code == 200
        _error(await c.post(f"/v1/sessions/{sid}/fork",
                            json={"from_turn_id": ok.json()["id"], "branch": "main"}),
               409, "branch_exists")
        _error(await c.post(f"/v1/sessions/{sid}/turns",
                            json={**USER, "parent_turn_id": ok.json()["parent_id"],
                                  "branch": "main"}), 409, "head_moved")
        _error(await c.post(f"/v1/sessions/{sid}/turns", json={"messages": []}),
               422, "validation_error")
        big = {"messages": [{"role": "user", "content": "x" * 5000}]}
        _error(await c.post(f"/v1/sessions/{sid}/turns", json=big), 413, "request_too_large")
        many = {"messages": [{"role": "user", "content": "x"}] * 9}
        _error(await c.post(f"/v1/sessions/{sid}/turns", json=many), 400, "invalid_request")
        _error(await c.post(f"/v1/sessions/{sid}/rewind",
                            json={"branch": "main", "to_turn_id": "0" * 32}),
               404, "turn_not_found")

    run_gateway(body, max_body_bytes=4096, max_messages=8)


def test_keys_and_tenant_isolation(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        keys = KeyStore(h.redis, h.settings.auth_key_prefix)
        key_a, key_b = await keys.create("alpha"), await keys.create("beta")
        _error(await c.post("/v1/sessions", json={}), 401, "authentication_error")
        _error(await c.post("/v1/sessions", json={}, headers={"x-api-key": "rg-wrong"}),
               401, "authentication_error")
        r = await c.post("/v1/sessions", json={}, headers={"Authorization": f"Bearer {key_a}"})
        assert r.status_code == 201
        sid = r.json()["id"]
        assert (await c.get(f"/v1/sessions/{sid}", headers={"x-api-key": key_a})).status_code \
            == 200
        for method, path in [("GET", ""), ("DELETE", ""), ("POST", "/turns")]:
            r = await c.request(method, f"/v1/sessions/{sid}{path}", json=USER,
                                headers={"x-api-key": key_b})
            _error(r, 404, "session_not_found")

    run_gateway(body)


def test_non_loopback_without_keys_needs_a_key(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        _error(await h.client.post("/v1/sessions", json={}), 401, "authentication_error")

    run_gateway(body, host="0.0.0.0")


def test_idempotent_replay(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        first = await c.post("/v1/sessions", json={}, headers={"Idempotency-Key": "k1"})
        again = await c.post("/v1/sessions", json={}, headers={"Idempotency-Key": "k1"})
        assert first.status_code == again.status_code == 201
        assert first.json() == again.json()
        _error(await c.post("/v1/sessions", json={"system": "other"},
                            headers={"Idempotency-Key": "k1"}), 422, "idempotency_conflict")
        sid = first.json()["id"]
        t1 = await c.post(f"/v1/sessions/{sid}/turns", json=USER,
                          headers={"Idempotency-Key": "t1"})
        t2 = await c.post(f"/v1/sessions/{sid}/turns", json=USER,
                          headers={"Idempotency-Key": "t1"})
        assert t1.status_code == t2.status_code == 200 and t1.json() == t2.json()
        view = (await c.get(f"/v1/sessions/{sid}")).json()
        assert len(view["turns"]) == 3  # root, one input, one assistant: no second generation
        other = {**USER, "messages": [{"role": "user", "content": "different"}]}
        _error(await c.post(f"/v1/sessions/{sid}/turns", json=other,
                            headers={"Idempotency-Key": "t1"}), 422, "idempotency_conflict")

    run_gateway(body)
