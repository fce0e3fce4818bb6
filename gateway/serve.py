"""`radixgate serve`: embedded Valkey (when no Redis URL), engine workers, and uvicorn.

Children: the Valkey server (AOF under `<state_dir>/valkey`) and `--workers` engine workers,
each restarted when it dies and each dying with `serve` (a parent-death signal on Linux).
Workers given with `--engine tcp://host:port` are someone else's: they are watched by a
heartbeat (`gateway.remote_worker`) and routed around while they do not answer. Their pids
and Valkey's URL go to `<state_dir>/serve.json`, which is how `radixgate keys` finds the store;
a later `serve` on the same state dir stops leftovers of a killed one (SIGTERM: Valkey flushes
its AOF) before starting its own.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn
from redis.asyncio import Redis
from redis.exceptions import RedisClusterException, RedisError

from gateway import event_loop
from gateway.app import create_app
from gateway.auth import KeyStore
from gateway.engine_pool import EnginePool
from gateway.remote_worker import RemoteWorker
from gateway.settings import GatewaySettings
from gateway.store_supervisor import StoreSupervisor
from gateway.worker import EngineSupervisor
from sessions.embedded import EmbeddedServerError, EmbeddedValkey
from sessions.redis_client import StoreClient, StoreUrlError, is_cluster_url, open_client, ping


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


class StoreNotFound(RuntimeError):
    """No session store can be found for the given settings (the message says what to do)."""


def embedded_data_dir(settings: GatewaySettings) -> Path:
    """Where the embedded Valkey of `settings.state_dir` keeps its AOF."""
    return (settings.state_dir / "valkey").resolve()


async def find_store_url(settings: GatewaySettings) -> str | None:
    """The URL of the store `serve` uses with these settings: `settings.redis_url`, else the
    running embedded Valkey recorded in `<state_dir>/serve.json` (checked to be the one serving
    this state dir), else None when no server runs there but its embedded store exists on disk.
    Raises StoreNotFound when a given URL does not answer or there is no store at all."""
    if settings.redis_url is not None:
        problem = await store_problem(settings.redis_url)
        if problem is not None:
            raise StoreNotFound(f"the store at {settings.redis_url} does not answer: {problem}")
        return settings.redis_url
    data_dir = embedded_data_dir(settings)
    url = read_pids(settings).get("valkey_url")
    if isinstance(url, str) and await _data_dir_of(url) == str(data_dir):
        return url
    if _alive_and_ours(read_pids(settings).get("valkey_pid"), ("valkey", "redis")):
        raise StoreNotFound(f"the embedded Valkey of {settings.state_dir} is restarting; retry")
    if not data_dir.is_dir():
        raise StoreNotFound(
            f"no radixgate store under {settings.state_dir}: start `radixgate serve "
            f"--state-dir {settings.state_dir}` once (it creates one), or pass --redis-url")
    return None


async def store_problem(url: str) -> str | None:
    """Why the store at `url` (one server or a cluster) cannot be used, or None when it answers
    (a cluster: its slot map is known and a node answered PING). Short timeouts: for a start-up
    check, not for serving."""
    try:
        client = open_client(url, socket_connect_timeout=2, socket_timeout=5)
    except StoreUrlError as exc:
        return str(exc)
    try:
        await ping(client)
    except (RedisError, RedisClusterException, OSError) as exc:
        kind = "cluster" if is_cluster_url(url) else "server"
        return f"no {kind} node answered ({type(exc).__name__}: {exc})"
    finally:
        await client.aclose()
    return None


async def _data_dir_of(url: str) -> str | None:
    """The `dir` of the server at `url`, or None when nothing answers there."""
    redis = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5,
                           decode_responses=True)
    try:
        reply = await redis.config_get("dir")
    except RedisError:
        return None
    finally:
        await redis.aclose()
    value = reply.get("dir")
    return str(value) if value else None


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
    engine_pids = pids.get("engine_pids")
    leftovers = [(pid, ("gateway.cli", "radixgate")) for pid in
                 (engine_pids if isinstance(engine_pids, list) else [pids.get("engine_pid")])]
    for pid, names in [*leftovers, (pids.get("valkey_pid"), ("valkey", "redis"))]:
        if not _alive_and_ours(pid, names):
            continue
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive_and_ours(pid, names) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive_and_ours(pid, names):
            os.kill(pid, signal.SIGKILL)


async def _access_banner(settings: GatewaySettings, redis: StoreClient) -> str:
    """What `serve` says about access at start. Raises ServeError for a non-loopback host with
    no key at all (unless --insecure)."""
    policy = settings.access_policy
    if policy.api_key is not None:
        return "API keys enforced (--api-key, and any key made by `radixgate keys create`)"
    if await KeyStore(redis, settings.auth_key_prefix).has_keys():
        return "API keys enforced (keys made by `radixgate keys create`)"
    if not policy.allow_open:
        raise ServeError(
            f"refusing to serve on {settings.host} without any API key: pass --api-key KEY, "
            "create one with `radixgate keys create --tenant NAME`, or pass --insecure")
    return ("open access: no API key is stored, so every request (with any key or none) is "
            "tenant 'local'; `radixgate keys create --tenant NAME` or --api-key enforces keys")


class _Stop(BaseException):
    """SIGTERM/SIGINT outside uvicorn's own handling (start-up, or uvicorn re-raising the signal
    after its graceful shutdown): unwinds through every `finally`, so the children stop."""


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signum)


async def _serve(settings: GatewaySettings, engine_args: list[str], num_workers: int,
                 remote: list[str], num_prefill: int, decode_args: list[str]) -> None:
    store: StoreSupervisor | None = None
    if settings.redis_url is None:
        valkey = EmbeddedValkey(embedded_data_dir(settings), appendfsync="always",
                                die_with_parent=True).start()
        store = StoreSupervisor(valkey, on_spawn=lambda pid: _write_pids(
            settings, valkey_pid=pid, valkey_url=valkey.url))
        store.start()
        print(f"radixgate serve: embedded Valkey at {valkey.url} (AOF with appendfsync always "
              f"under {valkey.data_dir}; restarted if it dies)", file=sys.stderr, flush=True)
        settings = settings.model_copy(update={"redis_url": valkey.url})
    assert settings.redis_url is not None
    if store is None:  # a store given by URL: fail at start, not on the first request
        problem = await store_problem(settings.redis_url)
        if problem is not None:
            raise ServeError(f"the store at --redis-url {settings.redis_url} cannot be used: "
                             f"{problem}")
    redis = open_client(settings.redis_url)
    engine_pids: list[int | None] = [None] * (num_workers + num_prefill)

    def on_spawn(index: int, pid: int) -> None:
        engine_pids[index] = pid
        _write_pids(settings, engine_pids=engine_pids, engine_pid=engine_pids[0])

    def supervisor(index: int, args: list[str]) -> EngineSupervisor:
        return EngineSupervisor(args, timeout_s=settings.engine_timeout_s,
                                restart_timeout_s=settings.engine_restart_timeout_s,
                                on_spawn=functools.partial(on_spawn, index))

    # Prefill workers are supervised like any worker but never routed to: the decode workers
    # (the ones turns go to) pull long deltas' KV from them.
    prefills = [supervisor(num_workers + i, engine_args) for i in range(num_prefill)]
    supervisors: list[EngineSupervisor] = []
    remotes = [RemoteWorker(address, timeout_s=settings.engine_timeout_s) for address in remote]
    try:
        banner = await _access_banner(settings, redis)
        print(f"radixgate serve: {banner}", file=sys.stderr, flush=True)
        await asyncio.gather(*(s.start() for s in prefills))
        peers = [arg for s in prefills for arg in ("--prefill-peer", s.name)]
        supervisors = [supervisor(i, [*engine_args, *decode_args, *peers])
                       for i in range(num_workers)]
        if prefills:
            print(f"radixgate serve: {num_prefill} prefill worker(s) at "
                  f"{', '.join(s.name for s in prefills)} send KV to {num_workers} decode "
                  "worker(s)", file=sys.stderr, flush=True)
        links = await asyncio.gather(*(s.start() for s in supervisors),
                                     *(r.start() for r in remotes))
        app = create_app(settings, engine_client=EnginePool(links), redis=redis,
                         store_supervisor=store)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                                lifespan="on")
        server = uvicorn.Server(config)
        print(f"radixgate serve: sessions in the browser at http://{settings.host}:"
              f"{settings.port}/ui", file=sys.stderr, flush=True)
        await server.serve()
        if not server.started:  # the lifespan failed (uvicorn logged why, e.g. a ConfigError)
            raise ServeError("the gateway did not start; see the error above")
    finally:
        for engine_supervisor in [*supervisors, *prefills]:
            await engine_supervisor.stop()
        for remote_worker in remotes:
            await remote_worker.stop()
        await redis.aclose()
        if store is not None:
            await store.stop()


def serve(settings: GatewaySettings, engine_args: list[str], *, num_workers: int = 1,
          remote: list[str] | None = None, num_prefill: int = 0,
          decode_args: list[str] | None = None) -> int:
    """Run until SIGINT/SIGTERM with `num_workers` spawned engine workers plus the `remote`
    ones (addresses), and `num_prefill` prefill workers the spawned ones (started with
    `decode_args` more) pull KV from. Returns the exit code. Every child (engine workers,
    embedded Valkey) is stopped on the way out, and dies with this process even if it is
    SIGKILLed."""
    if num_workers + len(remote or []) < 1:
        print("radixgate serve: error: no engine worker: pass --workers N (N >= 1) or "
              "--engine tcp://host:port", file=sys.stderr)
        return 2
    if num_prefill and num_workers < 1:
        print("radixgate serve: error: --prefill-workers needs --decode-workers D (D >= 1) to "
              "send KV to", file=sys.stderr)
        return 2
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    stop_leftovers(settings)
    if settings.model and "--model" not in engine_args:  # RADIXGATE_MODEL: one model for both
        engine_args = [*engine_args, "--model", settings.model]
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        event_loop.run(_serve(settings, engine_args, num_workers, list(remote or []),
                              num_prefill, list(decode_args or [])))
    except ServeError as exc:
        print(f"radixgate serve: error: {exc}", file=sys.stderr)
        return 2
    except (EmbeddedServerError, RuntimeError) as exc:
        print(f"radixgate serve: error: {exc}", file=sys.stderr)
        return 1
    except _Stop:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _write_pids(settings, engine_pids=[], engine_pid=None, valkey_pid=None)
    return 0
