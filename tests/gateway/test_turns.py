"""Turn generation through the gateway: SSE, prefix-cache reuse, UnknownParent fallback."""

from __future__ import annotations

import json
from collections.abc import Callable

from gateway.engine_link import EngineLink
from gateway.engine_pool import EnginePool
from gateway.rendering import TurnRenderer
from gateway.schemas import AppendTurnRequest
from gateway.turns import TurnService, TurnStarted
from gateway.views import sse_stream
from sessions import SessionStore
from tests.gateway.conftest import Harness

PAGE = 16


def parse_sse(raw: str) -> list[tuple[str, str, dict[str, object]]]:
    """(id, event, data) per frame; every frame must end with a blank line."""
    assert raw.endswith("\n\n")
    frames = []
    for block in raw.strip("\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        frames.append((fields["id"], fields["event"], json.loads(fields["data"])))
    return frames


def test_streamed_turn_matches_stored_turn(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = (await h.client.post("/v1/sessions", json={})).json()["id"]
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "stream please"}],
            "generate": {"max_tokens": 8, "stream": True}})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = parse_sse(r.text)
        events = [e for _, e, _ in frames]
        assert events[0] == "turn_start" and events[-1] == "turn_end"
        assert set(events[1:-1]) == {"text_delta"} and len(events) >= 3
        assert len({i for i, _, _ in frames}) == len(frames)
        text = "".join(str(d["text"]) for _, e, d in frames if e == "text_delta")
        end = frames[-1][2]["turn"]
        assert isinstance(end, dict) and end["usage"]["output_tokens"] == 8
        stored = (await h.client.get(f"/v1/sessions/{sid}/turns/{end['id']}")).json()
        assert stored["content"] == text == end["content"]

    run_gateway(body)


def test_six_turns_reuse_the_prefix_cache(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = (await h.client.post("/v1/sessions", json={"system": "Be brief."})).json()["id"]
        for i in range(6):
            r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
                "messages": [{"role": "user", "content": f"question number {i} " * (i + 1)}],
                "generate": {"max_tokens": 5}})
            assert r.status_code == 200, r.text
            turn = r.json()
            usage = turn["usage"]
            input_turn = (await h.client.get(
                f"/v1/sessions/{sid}/turns/{turn['parent_id']}")).json()
            delta = input_turn["num_tokens"]
            if i == 0:
                assert usage["cached_tokens"] == 0
                continue
            assert usage["cached_tokens"] > 0
            # The parent's partial page plus its uncomputed last tokens: at most PAGE + 1.
            assert delta <= usage["computed_tokens"] <= delta + PAGE + 1, (i, usage, delta)

    run_gateway(body)


def test_unknown_parent_falls_back_to_the_ledger(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = (await h.client.post("/v1/sessions", json={})).json()["id"]
        turns = []
        for i in range(3):
            await h.client.get("/readyz")  # a stats round trip: the engine has seen the pins
            if i == 2:
                h.engine.reset_cache()
            r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
                "messages": [{"role": "user", "content": f"turn {i}"}],
                "generate": {"max_tokens": 4}})
            assert r.status_code == 200, r.text
            turns.append(r.json())
        last = turns[-1]["usage"]
        assert last["cached_tokens"] == 0
        assert last["computed_tokens"] == last["input_tokens"]
        view = (await h.client.get(f"/v1/sessions/{sid}")).json()
        assert view["branches"]["main"] == turns[-1]["id"]

    run_gateway(body)


def test_closing_the_sse_stream_aborts_the_engine_request(
        run_gateway: Callable[..., None]) -> None:
    # httpx's ASGITransport buffers whole responses, so the disconnect is the SSE generator's
    # close, which is what Starlette does when the client goes away.
    async def body(h: Harness) -> None:
        sid = (await h.client.post("/v1/sessions", json={})).json()["id"]
        store = SessionStore(h.redis, key_prefix=h.settings.key_prefix)
        service = TurnService(store, EnginePool([EngineLink(h.engine_client)]),
                              TurnRenderer(h.tokenizer), pin_ttl_s=60, max_tokens_limit=4096,
                              model_id="tiny")
        request = AppendTurnRequest.model_validate({
            "messages": [{"role": "user", "content": "long"}],
            "generate": {"max_tokens": 3000, "stream": True}})
        events = service.run_turn("local", sid, request, expected_version=None)
        first = await anext(events)
        assert isinstance(first, TurnStarted)
        frames = sse_stream(first, events, "req_1")
        assert (await anext(frames)).startswith(b"id: ")
        assert b"event: text_delta" in await anext(frames)
        await frames.aclose()
        stats = await h.engine_client.stats()
        assert stats.num_running == 0 and stats.num_waiting == 0
        session = await store.get_session(sid, tenant="local")
        assert session.head() == session.root_turn_id  # no assistant turn was stored
        assert len(await store.get_tree(sid, tenant="local")) == 1  # and no input turn
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={  # the branch is free
            "messages": [{"role": "user", "content": "again"}], "generate": {"max_tokens": 2}})
        assert r.status_code == 200, r.text

    run_gateway(body)


def test_max_tokens_past_the_context_is_clamped(run_gateway: Callable[..., None]) -> None:
    """As hosted APIs do: the reply stops where the context ends (finish "length")."""

    async def body(h: Harness) -> None:
        sid = (await h.client.post("/v1/sessions", json={})).json()["id"]
        context_len = h.engine.loaded.model.config.max_position_embeddings
        long_text = "word " * (context_len - 60)
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": long_text}],
            "generate": {"max_tokens": 4000}})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["input_tokens"] + usage["output_tokens"] == context_len
        assert usage["output_tokens"] < 4000 and r.json()["finish_reason"] == "length"
        h.engine.check_invariants()

    run_gateway(body)
