"""`radixgate serve`: embedded Valkey (when no Redis URL), one engine worker, and uvicorn.

Children: the Valkey server (AOF under `<state_dir>/valkey`) and the engine worker. Their pids go to
`<state_dir>/serve.json`; a later `serve` on the same state dir stops leftovers of a killed one
(SIGTERM: Valkey flushes its AOF) before starting its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.auth import KeyStore
from gateway.settings import GatewaySettings
from gateway.worker import EngineSupervisor
from sessions.embedded import EmbeddedValkey


class ServeError(RuntimeError):
    """`serve` refuses to start (the message says why)."""


def pid_file(settings: GatewaySettings) -> Path:
    return settings.state_dir / "serve.json"


def read_pids(settings: GatewaySettings) -> dict[str, Any]:
    try:
        data = json.loads(pid_file(settings).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_pids(settings: GatewaySettings, **values: Any) -> None:
    data = {**read_pids(settings), **values}
    pid_file(settings).write_text(json.dumps(data))


def _alive_and_ours(pid: object, names: tuple[str, ...]) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(n.encode() in cmdline for n in names)


def stop_leftovers(settings: GatewaySettings) -> None:
    """Stop the children of an earlier `serve` on this state dir that outlived it."""
    pids = read_pids(settings)
    for key, names in (("engine_pid", ("gateway.cli", "radixgate")),
                       ("valkey_pid", ("valkey", "redis"))):
        pid = pids.get(key)
        if not _alive_and_ours(pid, names):
            continue
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive_and_ours(pid, names) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive_and_ours(pid, names):
            os.kill(pid, signal.SIGKILL)


async def _check_keys(settings: GatewaySettings, redis: Redis) -> None:
    if settings.is_loopback or settings.insecure:
        return
    if not await KeyStore(redis, settings.auth_key_prefix).has_keys():
        raise ServeError(
            f"refusing to serve on {settings.host} without any API key: create one with "
            "`radixgate keys create --tenant NAME`, or pass --insecure")


async def _serve(settings: GatewaySettings, engine_args: list[str]) -> None:
    assert settings.redis_url is not None
    redis = Redis.from_url(settings.redis_url)
    supervisor = EngineSupervisor(engine_args, timeout_s=settings.engine_timeout_s,
                                  on_spawn=lambda pid: _write_pids(settings, engine_pid=pid))
    try:
        await _check_keys(settings, redis)
        link = await supervisor.start()
        app = create_app(settings, engine_client=link, redis=redis)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                                lifespan="on")
        await uvicorn.Server(config).serve()
    finally:
        await supervisor.stop()
        await redis.aclose()


def serve(settings: GatewaySettings, engine_args: list[str]) -> int:
    """Run until SIGINT/SIGTERM. Returns the exit code."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    stop_leftovers(settings)
    valkey: EmbeddedValkey | None = None
    try:
        if settings.redis_url is None:
            valkey = EmbeddedValkey(settings.state_dir / "valkey").start()
            _write_pids(settings, valkey_pid=_valkey_pid(valkey.url), valkey_url=valkey.url)
            print(f"radixgate serve: embedded Valkey at {valkey.url} "
                  f"(AOF under {settings.state_dir / 'valkey'})", file=sys.stderr, flush=True)
            settings = settings.model_copy(update={"redis_url": valkey.url})
        asyncio.run(_serve(settings, engine_args))
    except ServeError as exc:
        print(f"radixgate serve: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if valkey is not None:
            valkey.stop()
    return 0


def _valkey_pid(url: str) -> int | None:
    import redis as sync_redis

    client = sync_redis.Redis.from_url(url)
    try:
        pid = client.info("server").get("process_id")
        return int(pid) if pid is not None else None
    finally:
        client.close()
