"""A primary SIGKILLed under load: no acknowledged turn is lost, and the requests that meet the
failover get a typed 503 with Retry-After, never a 500.

The gateway acknowledges a turn only after `WAIT 1` on the session's primary
(`sessions.durability`), so the replica that takes over holds every acknowledged turn. The
cluster is this module's own (it loses a node); cluster-node-timeout is 1 s.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from asgi_lifespan import LifespanManager

from engine.client import EngineClient
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.tokenizer import Tokenizer
from gateway.app import create_app
from gateway.settings import GatewaySettings
from sessions import SessionStore
from sessions.durability import Durability, NotReplicated
from sessions.keys import SessionKeys
from sessions.redis_client import open_client
from tests.cluster.local_cluster import LocalCluster
from tests.sessions.support import assistant, user

NUM_SESSIONS = 16
PREFIX = "fo:"
TURN = {"messages": [{"role": "user", "content": "go on"}], "generate": {"max_tokens": 2}}


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("failover"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_a_write_no_replica_acknowledged_fails_as_an_outage(own_cluster: LocalCluster) -> None:
    """With the session's replica down, WAIT 1 times out: the append raises NotReplicated (a
    store outage, 503), and succeeds again once the replica is back."""

    async def main() -> None:
        client = open_client(own_cluster.url)
        store = SessionStore(client, key_prefix="nr:", durability=Durability(1, 300))
        try:
            session = await store.create_session("acme", "m")
            primary = own_cluster.primary_of(SessionKeys("nr:", session.id).meta)
            replica = own_cluster.replica_of(primary)
            own_cluster.kill(replica)
            with pytest.raises(NotReplicated):
                await store.append_turns(session.id, tenant="acme", turns=[user(1)])
            own_cluster.restart(replica)  # on this (the main) thread: see `restart`
            await asyncio.to_thread(own_cluster.wait_healthy)
            # A replica just back from a full sync may take longer than 300 ms to ack its
            # first offsets on a loaded machine: the same WAIT, with a wider window.
            patient = SessionStore(client, key_prefix="nr:", durability=Durability(1, 10_000))
            await patient.append_turns(session.id, tenant="acme", turns=[assistant(2)])
            await store.check_invariants(session.id)
        finally:
            await client.aclose()

    asyncio.run(main())


@dataclass
class Tally:
    # (session id, reply turn id), or (session id, "") for a created session
    acked: list[tuple[str, str]] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)  # anything but 200 and a typed 503


async def _drive(client: httpx.AsyncClient, sid: str | None, stop: asyncio.Event,
                 tally: Tally) -> None:
    """Append turns to `sid` until `stop`; with None, create sessions instead (a create is not
    retried by the gateway, so one that meets the failover answers 503)."""
    while not stop.is_set():
        if sid is None:
            r = await client.post("/v1/sessions", json={})
        else:
            r = await client.post(f"/v1/sessions/{sid}/turns", json=TURN)
        if r.status_code in (200, 201):
            tally.acked.append((r.json()["id"], "") if sid is None else (sid, r.json()["id"]))
            tally.statuses[str(r.status_code)] += 1
            continue
        error = r.json().get("error", {})
        if (r.status_code == 503 and error.get("type") == "store_unavailable"
                and int(r.headers.get("retry-after", "0")) >= 1):
            tally.statuses["503 store_unavailable"] += 1
        else:
            tally.bad.append(f"{r.status_code} {r.text[:200]}")
        await asyncio.sleep(0.05)  # a client honouring Retry-After would wait longer


def test_sigkilled_primary_loses_no_acknowledged_turn(
        own_cluster: LocalCluster, tiny_loaded: LoadedModel, tokenizer: Tokenizer) -> None:
    own_cluster.wait_healthy()
    settings = GatewaySettings(redis_url=own_cluster.url, key_prefix=PREFIX,
                               store_wait_timeout_ms=1000)

    async def main() -> tuple[Tally, dict[str, float]]:
        engine_client = EngineClient.in_process(
            Engine(tiny_loaded, EngineConfig(kv_memory_bytes=64 << 20)))
        redis = open_client(own_cluster.url)
        app = create_app(settings, engine_client=engine_client, redis=redis,
                         tokenizer=tokenizer, model_name="tiny")
        tally, times = Tally(), {}
        try:
            async with LifespanManager(app) as manager:
                transport = httpx.ASGITransport(app=manager.app)
                async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                             timeout=120) as client:
                    sids = [(await client.post("/v1/sessions", json={})).json()["id"]
                            for _ in range(NUM_SESSIONS)]
                    victim = own_cluster.primary_of(SessionKeys(PREFIX, sids[0]).meta)
                    on_victim = sum(own_cluster.primary_of(SessionKeys(PREFIX, s).meta) is victim
                                    for s in sids)
                    stop = asyncio.Event()
                    drivers = [asyncio.create_task(_drive(client, s, stop, tally))
                               for s in [*sids, None]]
                    await asyncio.sleep(1.5)
                    before = len(tally.acked)
                    start = time.monotonic()
                    own_cluster.kill(victim)
                    await asyncio.to_thread(own_cluster.wait_promoted, victim)
                    times["promoted_s"] = time.monotonic() - start
                    own_cluster.restart(victim)  # back, as a replica of its successor
                    await asyncio.to_thread(own_cluster.wait_healthy)
                    times["healthy_s"] = time.monotonic() - start
                    await asyncio.sleep(1.5)
                    stop.set()
                    await asyncio.gather(*drivers)
                    times.update(acked_before_kill=before, sessions_on_victim=on_victim)
                    for sid, turn_id in tally.acked:
                        r = await client.get(f"/v1/sessions/{sid}/turns/{turn_id}" if turn_id
                                             else f"/v1/sessions/{sid}")
                        if r.status_code != 200:
                            tally.statuses["lost"] += 1
                    store = SessionStore(redis, key_prefix=PREFIX)
                    for sid in sids:
                        await store.check_invariants(sid)
        finally:
            await engine_client.close()
            await redis.aclose()
        return tally, times

    tally, times = asyncio.run(main())
    print(f"\nfailover: {len(tally.acked)} acknowledged (turns and creates), "
          f"{tally.statuses['lost']} lost, "
          f"{dict(tally.statuses)}, {times}, bad={tally.bad[:3]}")
    assert tally.statuses["lost"] == 0
    assert not tally.bad, tally.bad[:5]
    assert tally.statuses["503 store_unavailable"] > 0  # the failover was met, and typed
    assert len(tally.acked) > times["acked_before_kill"]  # and turns went on afterwards
