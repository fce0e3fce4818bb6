"""Several engine workers behind one gateway, and two gateways over one Redis: which worker
each turn goes to (`gateway.engine_pool`), with real in-process engines (tiny random model),
the real Redis and the app over ASGI."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from redis.asyncio import Redis

from engine.client import EngineClient
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.tokenizer import Tokenizer
from gateway.app import create_app
from gateway.engine_link import EngineLink
from gateway.engine_pool import EnginePool
from gateway.settings import GatewaySettings
from sessions import SessionStore

SYSTEM = "You are a careful coding agent. " * 12  # several KV pages shared by sessions

Gateways = list[tuple[httpx.AsyncClient, EnginePool]]
Body = Callable[[Gateways, list[Engine], SessionStore], Awaitable[None]]


def run_pool(redis_url: str, prefix: str, loaded: LoadedModel, tokenizer: Tokenizer,
             body: Body, *, num_workers: int = 2, num_gateways: int = 1) -> None:
    """`body(gateways, engines, store)`: `num_gateways` apps over one Redis, each routing to
    the same `num_workers` engines (one link per engine, shared: an in-process engine takes
    one client)."""

    async def main() -> None:
        engines = [Engine(loaded, EngineConfig(kv_memory_bytes=32 << 20))
                   for _ in range(num_workers)]
        links = [EngineLink(EngineClient.in_process(e), name=f"w{i}")
                 for i, e in enumerate(engines)]
        redis = Redis.from_url(redis_url)
        settings = GatewaySettings(redis_url=redis_url, key_prefix=prefix)
        pools = [EnginePool(links) for _ in range(num_gateways)]
        apps = [create_app(settings, engine_client=pool, redis=redis, tokenizer=tokenizer,
                           model_name="tiny") for pool in pools]
        try:
            async with LifespanManager(apps[0]) as m0, LifespanManager(apps[-1]) as m1:
                managers = [m0, m1][:num_gateways]
                clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=m.app),
                                             base_url="http://gw", timeout=60)
                           for m in managers]
                try:
                    await body(list(zip(clients, pools, strict=True)), engines,
                               SessionStore(redis, key_prefix=prefix))
                finally:
                    for client in clients:
                        await client.aclose()
            for engine in engines:
                engine.check_invariants()
        finally:
            for link in links:
                await link.close()
            await redis.aclose()

    asyncio.run(main())


async def turn(client: httpx.AsyncClient, sid: str, text: str) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/turns", json={
        "messages": [{"role": "user", "content": text}],
        "generate": {"max_tokens": 4, "temperature": 0}})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def workers_of(store: SessionStore, sid: str) -> list[str | None]:
    session = await store.get_session(sid, tenant="local")
    ids = await store.path_turn_ids(sid, session.branches[session.default_branch],
                                    tenant="local")
    turns = [await store.get_turn(sid, tid, tenant="local") for tid in ids]
    return [t.worker for t in turns if t.role == "assistant"]


def test_turns_stay_on_the_worker_of_their_parent_across_two_gateways(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    async def body(gateways: Gateways, engines: list[Engine], store: SessionStore) -> None:
        (a, pool_a), (b, pool_b) = gateways
        sids = [(await a.post("/v1/sessions", json={"system": f"session {i}. {SYSTEM}"})
                 ).json()["id"] for i in range(4)]
        for round_ in range(4):  # the gateways take turns; sessions go side by side
            client = (a, b)[round_ % 2]
            await asyncio.gather(*(turn(client, sid, f"step {round_}") for sid in sids))
        ids = {e.worker_id for e in engines}
        for sid in sids:
            workers = await workers_of(store, sid)
            assert len(workers) == 4 and len(set(workers)) == 1 and workers[0] in ids, workers
        # the first turn of each session was placed; every later one followed its parent
        assert pool_a.route_counts["bound"] + pool_b.route_counts["bound"] == 12
        assert pool_a.route_counts["bound"] == 4 and pool_b.route_counts["bound"] == 8

    run_pool(redis_url, redis_key_prefix, tiny_loaded, tokenizer, body, num_gateways=2)


def test_a_new_session_goes_to_the_worker_caching_its_prefix(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    async def body(gateways: Gateways, engines: list[Engine], store: SessionStore) -> None:
        ((client, pool),) = gateways
        first = (await client.post("/v1/sessions", json={"system": SYSTEM})).json()["id"]
        await turn(client, first, "hello")
        (home,) = await workers_of(store, first)
        assert pool.route_counts["least_loaded"] == 1
        second = (await client.post("/v1/sessions", json={"system": SYSTEM})).json()["id"]
        reply = await turn(client, second, "hello")
        assert await workers_of(store, second) == [home]
        assert pool.route_counts["prefix"] == 1
        assert reply["usage"]["cached_tokens"] > 0  # the system prompt's pages
        other = (await client.post("/v1/sessions", json={"system": "Different."})).json()["id"]
        await turn(client, other, "hello")
        assert pool.route_counts["least_loaded"] == 2

    run_pool(redis_url, redis_key_prefix, tiny_loaded, tokenizer, body)


def test_a_dead_workers_sessions_move_to_another_and_re_prefill(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    async def body(gateways: Gateways, engines: list[Engine], store: SessionStore) -> None:
        ((client, pool),) = gateways
        sid = (await client.post("/v1/sessions", json={"system": SYSTEM})).json()["id"]
        await turn(client, sid, "one")
        (home,) = await workers_of(store, sid)
        dead = pool.by_worker(home)
        assert dead is not None
        await dead.mark_down()  # what the supervisor does when the process exits
        reply = await turn(client, sid, "two")
        workers = await workers_of(store, sid)
        assert workers[0] == home and workers[1] != home and workers[1] is not None
        usage = reply["usage"]
        assert usage["cached_tokens"] == 0 and usage["computed_tokens"] == usage["input_tokens"]
        assert (await turn(client, sid, "three"))["usage"]["cached_tokens"] > 0
        assert (await workers_of(store, sid))[2] == workers[1]

    run_pool(redis_url, redis_key_prefix, tiny_loaded, tokenizer, body)


def test_a_turn_running_on_a_worker_that_dies_finishes_on_another(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    async def body(gateways: Gateways, engines: list[Engine], store: SessionStore) -> None:
        ((client, pool),) = gateways
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        request = client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "go on"}],
            "generate": {"max_tokens": 400, "temperature": 0}})
        task = asyncio.ensure_future(request)
        while not any(e.scheduler.running for e in engines):
            await asyncio.sleep(0.005)
        busy = next(i for i, e in enumerate(engines) if e.scheduler.running)
        await pool.links[busy].mark_down()
        r = await task
        assert r.status_code == 200, r.text
        assert (await workers_of(store, sid)) == [engines[1 - busy].worker_id]
        assert r.json()["usage"]["output_tokens"] == 400

    run_pool(redis_url, redis_key_prefix, tiny_loaded, tokenizer, body)
