"""The turn-commit protocol over HTTP: a retried stream with its key joins the running one (one
generation, one stored turn); a failed or aborted turn leaves nothing behind and frees its branch;
the store is asked at most three times before the engine sees a turn."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from redis.asyncio import Connection, ConnectionPool, Redis

from engine.client import EngineClient
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.tokenizer import Tokenizer
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.gateway.conftest import Harness
from tests.gateway.test_turns import parse_sse

STREAM = {"messages": [{"role": "user", "content": "tell a story"}],
          "generate": {"max_tokens": 40, "stream": True}}


async def _running(h: Harness) -> None:
    while not h.engine.scheduler.running:
        await asyncio.sleep(0.002)


def test_retried_stream_joins_the_running_one(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = (await h.client.post("/v1/sessions", json={})).json()["id"]
        headers = {"Idempotency-Key": "join-1"}
        first = asyncio.create_task(h.client.post(f"/v1/sessions/{sid}/turns", json=STREAM,
                                                  headers=headers))
        await _running(h)  # the first is generating: the retry must not start another
        second = await h.client.post(f"/v1/sessions/{sid}/turns", json=STREAM, headers=headers)
        a, b = parse_sse((await first).text), parse_sse(second.text)
        assert a == b and a[0][1] == "turn_start" and a[-1][1] == "turn_end"
        assert h.engine.stats().num_finished == 1  # one generation
        view = (await h.client.get(f"/v1/sessions/{sid}")).json()
        assert len(view["turns"]) == 3 and view["branches"]["main"] == a[-1][2]["turn"]["id"]
        # A joiner that saw some events resumes after them.
        late = await h.client.post(f"/v1/sessions/{sid}/turns", json=STREAM, headers=headers)
        assert [e for _, e, _ in parse_sse(late.text)] == ["turn_start", "text_delta",
                                                           "turn_end"]  # now a replay
        assert h.engine.stats().num_finished == 1

    run_gateway(body)


def test_failed_turn_leaves_nothing_and_frees_the_branch(
        run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = (await h.client.post("/v1/sessions", json={})).json()["id"]
        run = h.engine.runner.run
        calls = {"n": 0}

        def failing(items: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("a kernel bug")
            return run(items)

        h.engine.runner.run = failing  # type: ignore[method-assign]
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "hi"}], "generate": {"max_tokens": 20}})
        assert r.status_code == 500 and r.json()["error"]["type"] == "engine_error"
        view = (await h.client.get(f"/v1/sessions/{sid}")).json()
        assert len(view["turns"]) == 1  # no orphan input turn
        # The branch is free at once: the next turn begins and commits.
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "again"}], "generate": {"max_tokens": 4}})
        assert r.status_code == 200, r.text
        assert len((await h.client.get(f"/v1/sessions/{sid}")).json()["turns"]) == 3
        h.engine.check_invariants()

    run_gateway(body)


class _Counting(Connection):
    """Counts round trips: every command or pipeline is one packed send."""

    sends = 0

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        type(self).sends += 1
        await super().send_packed_command(*args, **kwargs)


def test_at_most_three_store_round_trips_before_the_engine(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    settings = GatewaySettings(redis_url=redis_url, key_prefix=redis_key_prefix)
    seen: list[int] = []

    async def main() -> None:
        engine = Engine(tiny_loaded, EngineConfig(kv_memory_bytes=64 << 20))
        submit = engine.submit

        def counting_submit(extend: Any) -> Any:
            seen.append(_Counting.sends)
            return submit(extend)

        engine.submit = counting_submit  # type: ignore[method-assign]
        client = EngineClient.in_process(engine)
        pool = ConnectionPool.from_url(redis_url, connection_class=_Counting)
        redis = Redis(connection_pool=pool)
        app = create_app(settings, engine_client=client, redis=redis, tokenizer=tokenizer,
                         model_name="tiny")
        try:
            async with LifespanManager(app) as manager:
                transport = httpx.ASGITransport(app=manager.app)
                async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                             timeout=60) as c:
                    await _count_each(c, seen)
        finally:
            await client.close()
            await redis.aclose()

    asyncio.run(main())
    print(f"\nstore round trips before the engine, per request: {seen}")


async def _count_each(c: httpx.AsyncClient, seen: list[int]) -> None:
    sid = (await c.post("/v1/sessions", json={})).json()["id"]
    chat: list[dict[str, Any]] = [{"role": "user", "content": "Hello there"}]
    claude: list[dict[str, Any]] = [{"role": "user", "content": "Hi Claude"}]
    requests: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
        ("native", f"/v1/sessions/{sid}/turns", {"messages": [{"role": "user", "content": "a"}],
                                                 "generate": {"max_tokens": 2}},
         {"Idempotency-Key": "k1"}),
        ("native stream", f"/v1/sessions/{sid}/turns", {
            "messages": [{"role": "user", "content": "b"}],
            "generate": {"max_tokens": 2, "stream": True}}, {"Idempotency-Key": "k2"}),
    ]
    for n, (name, path, payload, headers) in enumerate(requests):
        _Counting.sends = 0
        r = await c.post(path, json=payload, headers=headers)
        assert r.status_code == 200, (name, r.text)
        # The gateway's first turn also asks whether its tenant has limits (one script); the
        # answer "none" is remembered (`gateway.rate_limits.NO_LIMITS_TTL_S`).
        assert seen[-1] <= (4 if n == 0 else 3), (name, seen[-1])
    for step in range(2):  # a new conversation, then its next turn
        _Counting.sends = 0
        r = await c.post("/v1/chat/completions", json={
            "model": "gpt-4o", "messages": chat, "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200, r.text
        assert seen[-1] <= 3, ("openai", step, seen[-1])
        chat += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
        _Counting.sends = 0
        r = await c.post("/v1/messages", json={
            "model": "claude-sonnet-4", "max_tokens": 3, "messages": claude},
            headers={"x-claude-code-session-id": "cc-1"})
        assert r.status_code == 200, r.text
        assert seen[-1] <= 3, ("anthropic", step, seen[-1])
        claude += [{"role": "assistant", "content": r.json()["content"]},
                   {"role": "user", "content": "more"}]
