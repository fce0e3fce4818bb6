"""Session routes over ASGI: create / append / fork / rewind / get / delete."""

from __future__ import annotations

from collections.abc import Callable

from tests.gateway.conftest import Harness

GEN = {"max_tokens": 6}


async def _create(h: Harness, **body: object) -> dict[str, object]:
    r = await h.client.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def _turn(h: Harness, sid: object, text: str, **extra: object) -> dict[str, object]:
    r = await h.client.post(f"/v1/sessions/{sid}/turns",
                            json={"messages": [{"role": "user", "content": text}],
                                  "generate": GEN, **extra})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_create_append_get_fork_rewind_delete(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        created = await _create(h, system="You are terse.", metadata={"k": 1},
                                tools=[{"type": "function", "function": {"name": "ls"}},
                                       {"name": "read", "input_schema": {"type": "object"}}])
        sid, root = created["id"], created["head_turn_id"]
        assert created["branch"] == "main" and created["version"] == 1
        t1 = await _turn(h, sid, "hello")
        assert t1["role"] == "assistant" and t1["branch"] == "main"
        assert t1["finish_reason"] in ("stop", "length")
        usage = t1["usage"]
        assert isinstance(usage, dict) and usage["output_tokens"] >= 1
        assert usage["input_tokens"] == usage["cached_tokens"] + usage["computed_tokens"]
        t2 = await _turn(h, sid, "again")
        r = await h.client.get(f"/v1/sessions/{sid}")
        view = r.json()
        assert r.status_code == 200 and r.headers["etag"] == f'"v{view["version"]}"'
        assert view["branches"] == {"main": t2["id"]}
        assert view["metadata"] == {"k": 1} and len(view["tools"]) == 2
        assert [t["role"] for t in view["turns"]] == ["root", "user", "assistant"] * 1 + [
            "user", "assistant"]
        got = (await h.client.get(f"/v1/sessions/{sid}/turns/{t1['id']}")).json()
        assert got["content"] == t1["content"] and got["usage"] == usage
        r = await h.client.post(f"/v1/sessions/{sid}/fork",
                                json={"from_turn_id": t1["id"], "branch": "alt"})
        assert r.status_code == 201 and r.json()["branches"]["alt"] == t1["id"]
        alt = await _turn(h, sid, "other way", branch="alt")
        assert alt["branch"] == "alt" and alt["usage"]["cached_tokens"] > 0  # type: ignore[index]
        r = await h.client.post(f"/v1/sessions/{sid}/rewind",
                                json={"branch": "main", "to_turn_id": t1["id"]})
        assert r.status_code == 200 and r.json()["branches"]["main"] == t1["id"]
        t3 = await _turn(h, sid, "after rewind")
        assert (await h.client.get(f"/v1/sessions/{sid}/turns/{t3['id']}")).status_code == 200
        assert t3["usage"]["cached_tokens"] > 0  # type: ignore[index]
        r = await h.client.post(f"/v1/sessions/{sid}/rewind",
                                json={"branch": "main", "to_turn_id": str(root)})
        assert r.status_code == 200
        assert (await h.client.delete(f"/v1/sessions/{sid}")).status_code == 204
        assert (await h.client.get(f"/v1/sessions/{sid}")).status_code == 404
        assert (await h.client.delete(f"/v1/sessions/{sid}")).status_code == 404

    run_gateway(body)


def test_health_and_openapi(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        assert (await h.client.get("/healthz")).json() == {"status": "ok"}
        ready = await h.client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["engine"] is True
        spec = (await h.client.get("/openapi.json")).json()
        assert "/v1/sessions/{session_id}/turns" in spec["paths"]

    run_gateway(body)
