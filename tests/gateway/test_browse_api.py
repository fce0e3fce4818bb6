"""The routes behind `/ui` over ASGI: the session listing and its search, the tree in pages,
a turn's computed text, the overview, and tenancy across all of them. (The event stream needs a
real server: `test_session_events.py`.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from gateway.auth import KeyStore
from sessions.reader import SessionReader
from tests.gateway.conftest import Harness

GEN = {"max_tokens": 8}


async def _session(c: httpx.AsyncClient, headers: dict[str, str] | None = None,
                   **body: Any) -> str:
    r = await c.post("/v1/sessions", json=body, headers=headers or {})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def _turn(c: httpx.AsyncClient, sid: str, text: str,
                headers: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    r = await c.post(f"/v1/sessions/{sid}/turns", headers=headers or {},
                     json={"messages": [{"role": "user", "content": text}], "generate": GEN,
                           **extra})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _tree(c: httpx.AsyncClient, sid: str, **params: Any) -> dict[str, Any]:
    r = await c.get(f"/v1/sessions/{sid}/tree", params=params)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_listing_is_newest_first_searchable_and_paged(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        ids = [await _session(c, metadata={"task": f"swe-{n}", "repo": "django"})
               for n in range(5)]
        other = await _session(c, metadata={"task": "Flask-bug"})
        r = await c.get("/v1/sessions", params={"limit": 3})
        page = r.json()
        assert r.status_code == 200 and page["object"] == "list"
        listed = [s["id"] for s in page["data"]]
        assert listed == [other, ids[4], ids[3]] and page["next_cursor"] is not None
        rest = (await c.get("/v1/sessions", params={"cursor": page["next_cursor"]})).json()
        assert [s["id"] for s in rest["data"]][:3] == [ids[2], ids[1], ids[0]]
        first = page["data"][0]
        assert first["metadata"] == {"task": "Flask-bug"} and first["num_turns"] == 1
        assert first["branches"] == {"main": first["branches"]["main"]}
        found = (await c.get("/v1/sessions", params={"q": "flask"})).json()["data"]
        assert [s["id"] for s in found] == [other]  # metadata, case-insensitive
        found = (await c.get("/v1/sessions", params={"q": ids[2][-8:]})).json()["data"]
        assert [s["id"] for s in found] == [ids[2]]  # a piece of the id
        r = await c.get("/v1/sessions", params={"cursor": "x1"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request"
        await c.delete(f"/v1/sessions/{ids[4]}")
        listed = [s["id"] for s in (await c.get("/v1/sessions")).json()["data"]]
        assert ids[4] not in listed and ids[3] in listed

    run_gateway(body)


def test_tree_pages_carry_usage_timings_and_match_the_session(
        run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        sid = await _session(c, metadata={"k": 1})
        t1 = await _turn(c, sid, "hello")
        await _turn(c, sid, "again")
        r = await c.post(f"/v1/sessions/{sid}/fork", json={"from_turn_id": t1["id"],
                                                            "branch": "alt"})
        assert r.status_code == 201
        await _turn(c, sid, "on the fork", branch="alt")
        view = (await c.get(f"/v1/sessions/{sid}")).json()
        whole = await _tree(c, sid)
        assert whole["num_turns"] == len(view["turns"]) == 7 and whole["next_offset"] is None
        assert whole["session"]["branches"] == view["branches"]
        shape = [(t["id"], t["parent_id"], t["role"], t["depth"], t["num_tokens"])
                 for t in whole["turns"]]
        assert shape == [(t["id"], t["parent_id"], t["role"], t["depth"], t["num_tokens"])
                         for t in view["turns"]]
        assert [t["seq"] for t in whole["turns"]] == list(range(7))
        paged: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = await _tree(c, sid, offset=offset, limit=4)
            paged += page["turns"]
            offset = page["next_offset"]
        assert paged == whole["turns"]
        for row in whole["turns"]:
            if row["role"] != "assistant":
                assert row["usage"] is None
                continue
            turn = (await c.get(f"/v1/sessions/{sid}/turns/{row['id']}")).json()
            usage = row["usage"]
            for k in ("input_tokens", "cached_tokens", "computed_tokens", "output_tokens",
                      "ttft_ms", "decode_ms", "drafted_tokens", "accepted_tokens"):
                assert usage[k] == turn["usage"][k], k
            assert usage["ttft_ms"] > 0 and usage["decode_ms"] >= 0
            if usage["output_tokens"] > 1:
                rate = (usage["output_tokens"] - 1) / (usage["decode_ms"] / 1000)
                assert usage["decode_tokens_per_s"] == round(rate, 1)
            assert row["finish_reason"] == turn["finish_reason"]
            assert row["summary"] == " ".join((turn["content"] or "").split())[:160]
        users = [t for t in whole["turns"] if t["role"] == "user"]
        assert [u["summary"] for u in users] == ["hello", "again", "on the fork"]
        r = await c.get(f"/v1/sessions/{sid}/tree", params={"limit": 5000})
        assert r.status_code == 422

    run_gateway(body)


def test_computed_text_is_the_prompt_after_the_cached_prefix(
        run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        sid = await _session(c)
        await _turn(c, sid, "first question")
        t2 = await _turn(c, sid, "second question")
        got = (await c.get(f"/v1/sessions/{sid}/turns/{t2['id']}/computed")).json()
        usage = t2["usage"]
        assert got["computed_tokens"] == usage["computed_tokens"] > 0
        reader = SessionReader(h.redis, key_prefix=h.settings.key_prefix)
        prompt = await reader.token_path(sid, t2["parent_id"], tenant="local")
        assert len(prompt) == usage["input_tokens"]
        text, tail = got["computed_text"], got["cached_tail"]
        assert text == h.tokenizer.decode(prompt[usage["cached_tokens"]:])
        assert "second question" in text and "first question" not in text
        cached_text = h.tokenizer.decode(prompt[:usage["cached_tokens"]])
        assert tail and cached_text.endswith(tail) and len(tail) <= 200
        user = (await c.get(f"/v1/sessions/{sid}/turns/{t2['parent_id']}/computed")).json()
        assert user["computed_text"] is None and user["computed_tokens"] is None

    run_gateway(body)


def test_overview_counts_the_turns_this_gateway_finished(
        run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        sid = await _session(c)
        turns = [await _turn(c, sid, f"q{n}") for n in range(3)]
        got = (await c.get("/v1/ui/overview")).json()
        assert got["window_s"] == 3600 and got["bucket_s"] == 60 and len(got["buckets"]) == 60
        totals = got["totals"]
        usages = [t["usage"] for t in turns]
        assert totals["num_turns"] == 3
        assert totals["hit_rate"] == round(sum(u["cached_tokens"] for u in usages)
                                           / sum(u["input_tokens"] for u in usages), 4)
        ttfts = sorted(u["ttft_ms"] for u in usages)
        assert abs(totals["ttft_ms"]["p50"] - ttfts[1]) < 0.05
        assert abs(totals["ttft_ms"]["p99"] - ttfts[2]) < 0.05
        (rate,) = totals["tokens_per_s"].values()
        assert rate == round(sum(u["output_tokens"] for u in usages) / 3600, 3)
        assert sum(b["num_turns"] for b in got["buckets"]) == 3

    run_gateway(body)


def test_another_tenant_sees_none_of_it(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        c = h.client
        keys = KeyStore(h.redis, h.settings.auth_key_prefix)
        alpha = {"Authorization": f"Bearer {await keys.create('alpha')}"}
        beta = {"Authorization": f"Bearer {await keys.create('beta')}"}
        sid = await _session(c, alpha, metadata={"owner": "alpha"})
        t1 = await _turn(c, sid, "secret", alpha)
        assert (await c.get("/v1/sessions")).status_code == 401
        assert (await c.get("/v1/ui/overview")).status_code == 401
        listed = (await c.get("/v1/sessions", headers=beta)).json()["data"]
        assert sid not in [s["id"] for s in listed]
        found = (await c.get("/v1/sessions", params={"q": "alpha"}, headers=beta)).json()
        assert found["data"] == []
        for path in (f"/v1/sessions/{sid}/tree", f"/v1/sessions/{sid}/events",
                     f"/v1/sessions/{sid}/turns/{t1['id']}/computed"):
            r = await c.get(path, headers=beta)
            assert r.status_code == 404, path
            assert r.json()["error"]["type"] == "session_not_found"
        mine = (await c.get("/v1/sessions", headers=alpha)).json()["data"]
        assert sid in [s["id"] for s in mine]

    run_gateway(body)
