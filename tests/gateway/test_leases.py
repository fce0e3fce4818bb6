"""A lease that cannot be given back while the store is down is given back once it returns, so
the retry of the failed turn never meets `branch_busy` on a branch nothing runs on."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError

from gateway.leases import LeaseKeeper
from sessions import SessionStore
from sessions.embedded import EmbeddedValkey


@asynccontextmanager
async def _keeper(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedValkey, Redis, SessionStore,
                                                         LeaseKeeper]]:
    """A real Valkey (appendfsync always, so a crash loses no write), a store and a keeper."""
    with EmbeddedValkey(tmp_path, appendfsync="always") as valkey:
        redis = Redis.from_url(valkey.url)
        store = SessionStore(redis)
        keeper = LeaseKeeper(store, ttl_s=30.0)
        try:
            yield valkey, redis, store, keeper
        finally:
            await keeper.aclose()
            await redis.aclose()


def _crash(valkey: EmbeddedValkey) -> None:
    """SIGKILL the server process, as a crash would (`restart` then brings it back)."""
    assert valkey.pid is not None
    os.kill(valkey.pid, signal.SIGKILL)
    while valkey.is_running:
        time.sleep(0.01)


async def _restart_with_lease_held(valkey: EmbeddedValkey, keeper: LeaseKeeper,
                                   store: SessionStore) -> tuple[str, str]:
    """A session whose main branch is leased by a turn that failed while the store was dead."""
    session = await store.create_session("acme", "m", system_token_ids=[1, 2])
    start = await keeper.begin(session.id, tenant="acme", lease_id="a" * 32, branch=None,
                               parent_turn_id=None, expected_version=None, fork_branch=None)
    _crash(valkey)
    await keeper.release(start)  # never raises: remembered instead
    assert keeper.num_pending == 1
    valkey.restart()
    return session.id, start.lease_id


def test_settle_releases_a_lease_left_by_an_outage(tmp_path: Path) -> None:
    async def body() -> None:
        async with _keeper(tmp_path) as (valkey, redis, store, keeper):
            sid, _ = await _restart_with_lease_held(valkey, keeper, store)
            start = await keeper.begin(sid, tenant="acme", lease_id="c" * 32, branch=None,
                                       parent_turn_id=None, expected_version=None,
                                       fork_branch=None)
            assert start.branch == "main" and keeper.num_pending == 0
            await keeper.release(start)
            assert await redis.hlen(store.keys(sid).base + "leases") == 0

    asyncio.run(body())


def test_background_release_once_the_store_returns(tmp_path: Path) -> None:
    async def body() -> None:
        async with _keeper(tmp_path) as (valkey, redis, store, keeper):
            sid, _ = await _restart_with_lease_held(valkey, keeper, store)
            for _ in range(100):
                if keeper.num_pending == 0:
                    break
                await asyncio.sleep(0.05)
            assert keeper.num_pending == 0
            assert await redis.hlen(store.keys(sid).base + "leases") == 0

    asyncio.run(body())


def test_begin_lost_to_an_outage_releases_whatever_it_took(tmp_path: Path) -> None:
    async def body() -> None:
        async with _keeper(tmp_path) as (valkey, redis, store, keeper):
            session = await store.create_session("acme", "m", system_token_ids=[1])
            # The answer of a begin that ran is lost: it took "main" under this lease id.
            await store.turns.begin_turn(session.id, tenant="acme", lease_id="d" * 32,
                                         lease_ttl_s=30.0)
            _crash(valkey)
            with pytest.raises(ConnectionError):
                await keeper.begin(session.id, tenant="acme", lease_id="d" * 32,
                                   branch=None, parent_turn_id=None,
                                   expected_version=None, fork_branch=None)
            assert keeper.num_pending == 1
            valkey.restart()
            await keeper.settle(session.id)
            assert await redis.hlen(store.keys(session.id).base + "leases") == 0

    asyncio.run(body())
