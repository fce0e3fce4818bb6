"""`GET /v1/sessions/{id}/events` on a real uvicorn (httpx's ASGI transport buffers a whole
response, and this one never ends by itself): the stored events replayed, then generation
events of a streamed turn as it runs, resuming with Last-Event-ID, and the end on delete."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.local_server import serve_local
from gateway.settings import GatewaySettings
from tests.redis_keys import delete_key_prefix
from tests.tiny_model import tiny_model

GEN = {"max_tokens": 8}


@pytest.fixture(scope="module")
def base_url(redis_url: str) -> Iterator[str]:
    torch.set_num_threads(1)
    prefix = "test:events:"
    settings = GatewaySettings(redis_url=redis_url, key_prefix=prefix, sse_keepalive_s=0.2)
    loaded = tiny_model(Tokenizer.from_gguf(embedded_gguf_path()))
    try:
        with serve_local(loaded, settings, model_name="tiny", kv_memory_bytes=64 << 20) as url:
            yield url
    finally:
        delete_key_prefix(redis_url, prefix)


async def _session(c: httpx.AsyncClient) -> str:
    r = await c.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def _turn(c: httpx.AsyncClient, sid: str, text: str) -> dict[str, Any]:
    r = await c.post(f"/v1/sessions/{sid}/turns",
                     json={"messages": [{"role": "user", "content": text}], "generate": GEN})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _read_events(c: httpx.AsyncClient, sid: str, out: list[dict[str, Any]],
                       headers: dict[str, str] | None = None) -> None:
    async with c.stream("GET", f"/v1/sessions/{sid}/events", headers=headers or {}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        event_id = None
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                out.append({**data, "_id": event_id})
                event_id = None
                if data["type"] == "session.deleted":
                    return


def test_event_stream_replays_then_streams_generation_and_ends_on_delete(
        base_url: str) -> None:
    async def body(c: httpx.AsyncClient) -> None:
        sid = await _session(c)
        t1 = await _turn(c, sid, "hello")
        events: list[dict[str, Any]] = []
        reader = asyncio.create_task(_read_events(c, sid, events))
        for _ in range(100):
            if events:
                break
            await asyncio.sleep(0.02)
        assert [e["type"] for e in events] == ["session.created", "turns.appended"]
        assert events[1]["turn_ids"] == [t1["parent_id"], t1["id"]]
        r = await c.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "stream it"}],
            "generate": {**GEN, "stream": True}})
        assert r.status_code == 200
        end = [json.loads(line[6:]) for line in r.text.splitlines()
               if line.startswith("data: ") and '"turn_end"' in line][0]
        # The store's event and this gateway's generation.ended race (either may come first).
        for _ in range(250):
            if any(e["type"] == "turns.appended" and end["turn"]["id"] in e["turn_ids"]
                   for e in events) and any(e["type"] == "generation.ended" for e in events):
                break
            await asyncio.sleep(0.02)
        kinds = [e["type"] for e in events[2:]]
        assert kinds[0] == "generation.started" and "generation.ended" in kinds, events[-3:]
        live = "".join(e["text"] for e in events if e["type"] == "generation.delta")
        assert live == end["turn"]["content"]
        assert all(e["_id"] is None for e in events if e["type"].startswith("generation."))
        appended = [e for e in events if e["type"] == "turns.appended"][-1]
        assert appended["turn_ids"][-1] == end["turn"]["id"] and appended["_id"]
        # Resuming after the first event replays the rest of the stored ones.
        resumed: list[dict[str, Any]] = []
        again = asyncio.create_task(_read_events(c, sid, resumed,
                                                 {"Last-Event-ID": events[0]["_id"]}))
        for _ in range(250):
            if len(resumed) >= 2:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # nothing more may follow
        assert [e["type"] for e in resumed] == ["turns.appended", "turns.appended"]
        assert (await c.delete(f"/v1/sessions/{sid}")).status_code == 204
        await asyncio.wait_for(asyncio.gather(reader, again), 5)
        assert events[-1]["type"] == resumed[-1]["type"] == "session.deleted"
        r = await c.get(f"/v1/sessions/{sid}/events")
        assert r.status_code == 404
        r = await c.get(f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": "x"})
        assert r.status_code in (400, 404)

    async def main() -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as c:
            await body(c)

    asyncio.run(main())


