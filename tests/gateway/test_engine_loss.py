"""Turns survive an engine-worker restart: a non-streamed turn in flight runs on to the same
result on the new worker; a stream that already showed output ends with a retryable
`turn_interrupted` error, and the SDK's retry (same Idempotency-Key, Last-Event-ID) continues
it; a finished stream is replayed to a retry, never generated twice."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import sdk
from tests.gateway.conftest import Harness
from tests.gateway.test_turns import parse_sse

MAX_TOKENS = 40


async def _session(h: Harness) -> str:
    r = await h.client.post("/v1/sessions", json={"system": "Be brief."})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _turn_body(text: str, **generate: object) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}],
            "generate": {"max_tokens": MAX_TOKENS, **generate}}


async def _restart_once_output_reaches(h: Harness, num_tokens: int) -> int:
    """Play a worker death once the running turn has `num_tokens` output tokens; return how
    many it had (the restart lands between two engine steps)."""
    while True:
        running = list(h.engine.scheduler.running)
        if running and len(running[0].output_ids) >= num_tokens:
            reached = len(running[0].output_ids)
            await h.restart_engine()
            return reached
        await asyncio.sleep(0.002)


def test_non_streamed_turn_runs_on_through_a_worker_restart(
        run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        reference_sid, sid = await _session(h), await _session(h)
        reference = await h.client.post(f"/v1/sessions/{reference_sid}/turns",
                                        json=_turn_body("count the stars"))
        assert reference.status_code == 200
        await h.restart_engine()  # the interrupted turn starts on a cold engine, like the first
        turn = asyncio.create_task(h.client.post(f"/v1/sessions/{sid}/turns",
                                                 json=_turn_body("count the stars")))
        reached = await _restart_once_output_reaches(h, 5)
        r = await turn
        assert r.status_code == 200, r.text  # latency, not an error
        assert 5 <= reached < MAX_TOKENS
        got, want = r.json(), reference.json()
        assert got["content"] == want["content"]  # greedy: the same as one uninterrupted run
        assert got["usage"]["output_tokens"] == want["usage"]["output_tokens"] == MAX_TOKENS
        assert got["finish_reason"] == want["finish_reason"] == "length"
        assert h.link.restarts == 2
        h.engine.check_invariants()
        view = (await h.client.get(f"/v1/sessions/{sid}")).json()
        assert len(view["turns"]) == 3 and view["branches"]["main"] == got["id"]

    run_gateway(body, restart_timeout_s=30)


def test_interrupted_stream_is_continued_by_the_sdk_retry(
        run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        reference_sid, sid = await _session(h), await _session(h)
        reference = (await h.client.post(f"/v1/sessions/{reference_sid}/turns",
                                         json=_turn_body("tell a story"))).json()
        await h.restart_engine()
        client = sdk.AsyncClient("http://gw", http_client=h.client)
        session = await client.sessions.get(sid)
        restart = asyncio.create_task(_restart_once_output_reaches(h, 5))
        texts: list[str] = []
        async with session.stream("tell a story", max_tokens=MAX_TOKENS) as stream:
            async for text in stream.text_stream:
                texts.append(text)
            final = await stream.get_final_turn()
        await restart
        assert "".join(texts) == final.content == reference["content"]
        assert final.usage is not None and final.usage.output_tokens == MAX_TOKENS
        view = (await h.client.get(f"/v1/sessions/{sid}")).json()
        assert len(view["turns"]) == 3  # one input turn, one reply: continued, not rerun

    run_gateway(body, restart_timeout_s=30)


def test_interrupted_stream_on_the_wire(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = await _session(h)
        headers = {"Idempotency-Key": "stream-1"}
        payload = _turn_body("tell a story", stream=True)
        restart = asyncio.create_task(_restart_once_output_reaches(h, 5))
        first = parse_sse((await h.client.post(f"/v1/sessions/{sid}/turns", json=payload,
                                               headers=headers)).text)
        await restart
        last_id, event, error = first[-1]
        assert event == "error" and error["error"] == {  # type: ignore[comparison-overlap]
            "type": "turn_interrupted", "status": 503, "retryable": True,
            "message": error["error"]["message"]}  # type: ignore[index]
        shown = "".join(str(d["text"]) for _, e, d in first if e == "text_delta")
        assert shown
        again = parse_sse((await h.client.post(
            f"/v1/sessions/{sid}/turns", json=payload,
            headers={**headers, "Last-Event-ID": first[-2][0]})).text)
        # The continuation picks up after the last event shown: no turn_start, ids go on.
        assert again[0][1] != "turn_start" and again[0][0] == last_id
        assert again[-1][1] == "turn_end"
        rest = "".join(str(d["text"]) for _, e, d in again if e == "text_delta")
        turn = again[-1][2]["turn"]
        assert isinstance(turn, dict) and turn["content"] == shown + rest
        # A third request with the key replays the finished turn instead of generating.
        replay = parse_sse((await h.client.post(f"/v1/sessions/{sid}/turns", json=payload,
                                                headers=headers)).text)
        assert [e for _, e, _ in replay] == ["turn_start", "text_delta", "turn_end"]
        assert replay[-1][2]["turn"] == turn and replay[1][2]["text"] == turn["content"]
        assert len((await h.client.get(f"/v1/sessions/{sid}")).json()["turns"]) == 3

    run_gateway(body, restart_timeout_s=30)


def test_a_worker_that_never_comes_back_is_a_503(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = await _session(h)
        await h.link.mark_down()
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json=_turn_body("hello"))
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["type"] == "engine_unavailable"
        assert (await h.client.get("/readyz")).status_code == 503

    run_gateway(body, restart_timeout_s=0.3)
