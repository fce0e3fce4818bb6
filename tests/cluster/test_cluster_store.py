"""Cluster-only behaviour of the store: scripts come back after NOSCRIPT, the tenant-wide keys
share one slot, and `radixgate serve` refuses a cluster it cannot reach."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from redis.asyncio.cluster import RedisCluster

from sessions.keys import tenant_index_key, tenant_paths_key
from sessions.redis_client import open_client
from tests.cluster.conftest import WAIT_ONE
from tests.sessions.support import assistant, open_store, user


def test_scripts_reload_after_noscript(redis_url: str, redis_key_prefix: str) -> None:
    async def main() -> None:
        async with open_store(redis_url, redis_key_prefix, durability=WAIT_ONE) as store:
            session = await store.create_session("acme", "m")
            await store.redis.script_flush()  # every primary: what a failover's new one has
            await store.append_turns(session.id, tenant="acme", turns=[user(1), assistant(2)])
            await store.redis.script_flush()
            assert len(await store.get_tree(session.id, tenant="acme")) == 3
            await store.redis.script_flush()
            await store.delete_session(session.id, tenant="acme")

    asyncio.run(main())


def test_tenant_keys_share_a_slot(redis_url: str) -> None:
    async def main() -> None:
        client = open_client(redis_url)
        try:
            assert isinstance(client, RedisCluster)
            index, paths = tenant_index_key("rg:", "acme"), tenant_paths_key("rg:", "acme")
            assert client.keyslot(index) == client.keyslot(paths)
            assert client.keyslot(index) != client.keyslot(tenant_index_key("rg:", "beta"))
        finally:
            await client.aclose()

    asyncio.run(main())


def test_serve_stops_at_start_on_an_unreachable_cluster(tmp_path: Path) -> None:
    url = "redis+cluster://127.0.0.1:1,127.0.0.1:2"
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--redis-url", url,
         "--state-dir", str(tmp_path), "--workers", "1", "--port", "0"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"the store at --redis-url {url} cannot be used: no cluster node answered" in (
        done.stderr), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
