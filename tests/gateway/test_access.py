"""Who may call: open access while no key is stored (any key or none is the local tenant, as
vLLM and llama.cpp serve without --api-key), keys enforced once one exists or with `api_key`."""

from __future__ import annotations

from collections.abc import Callable

from gateway.auth import KeyStore
from tests.gateway.conftest import Harness
from tests.gateway.test_errors_auth import _error


def test_open_access_takes_any_key_until_one_is_stored(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        sids = []
        for headers in ({}, {"x-api-key": "anything"}, {"Authorization": "Bearer sk-dummy"},
                        {"Authorization": "Basic dXNlcjpwYXNz"}):
            r = await c.post("/v1/sessions", json={}, headers=headers)
            assert r.status_code == 201, (headers, r.text)
            sids.append(r.json()["id"])
        # All of them are the one local tenant: each sees the others' sessions.
        for sid in sids:
            assert (await c.get(f"/v1/sessions/{sid}",
                                headers={"x-api-key": "other"})).status_code == 200
        key = await KeyStore(h.redis, h.settings.auth_key_prefix).create("alpha")
        _error(await c.post("/v1/sessions", json={}, headers={"x-api-key": "anything"}),
               401, "authentication_error")
        _error(await c.post("/v1/sessions", json={}), 401, "authentication_error")
        r = await c.post("/v1/sessions", json={}, headers={"x-api-key": key})
        assert r.status_code == 201
        # The local tenant's sessions are not alpha's.
        _error(await c.get(f"/v1/sessions/{sids[0]}", headers={"x-api-key": key}),
               404, "session_not_found")

    run_gateway(body)


def test_api_key_setting_enforces_keys(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        _error(await c.post("/v1/sessions", json={}), 401, "authentication_error")
        _error(await c.post("/v1/sessions", json={}, headers={"x-api-key": "anything"}),
               401, "authentication_error")
        r = await c.post("/v1/sessions", json={}, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 201
        key = await KeyStore(h.redis, h.settings.auth_key_prefix).create("alpha")
        assert (await c.post("/v1/sessions", json={},
                             headers={"x-api-key": key})).status_code == 201

    run_gateway(body, api_key="s3cret")


def test_insecure_non_loopback_host_is_open(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        r = await h.client.post("/v1/sessions", json={}, headers={"x-api-key": "anything"})
        assert r.status_code == 201

    run_gateway(body, host="0.0.0.0", insecure=True)
