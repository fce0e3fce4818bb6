"""The engine worker process that `radixgate serve` owns: spawn, wait until ready, restart.

The worker is `radixgate engine --port <free port>`; it dies with the gateway (PR_SET_PDEATHSIG on
Linux). When it exits unexpectedly the supervisor marks the `EngineLink` down (requests in flight
get `engine_shutdown`, and the turn service runs them again once a worker is back), starts a new
worker and swaps its client in. A worker that fails to start is tried again with backoff.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence

from engine.client import EngineClient
from engine.protocol import Stats
from gateway.engine_link import EngineLink

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the stale-pid sweep of `serve` cleans up instead


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _is_free(port: int) -> bool:
    """Nothing listens on `port` (a dead listener's TIME_WAIT does not count: ZeroMQ binds
    with SO_REUSEADDR too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class EngineSupervisor:
    """Owns one engine worker process at a time. `on_spawn(pid)` is called for each new one."""

    def __init__(self, engine_args: Sequence[str], *, timeout_s: float = 600.0,
                 ready_timeout_s: float = 300.0, restart_timeout_s: float = 300.0,
                 on_spawn: Callable[[int], None] | None = None) -> None:
        self.engine_args = list(engine_args)
        self.timeout_s = timeout_s
        self.restart_timeout_s = restart_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.on_spawn = on_spawn
        self.link: EngineLink | None = None
        self.name = ""  # the current worker's address
        self._port: int | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> EngineLink:
        """Spawn the worker and return once it answers a stats request.
        Raises RuntimeError if it exits or does not answer within `ready_timeout_s`."""
        self._process, client, stats = await self._spawn()
        self.link = EngineLink(client, pid=self._process.pid, timeout_s=self.timeout_s,
                               restart_timeout_s=self.restart_timeout_s,
                               worker_id=stats.worker_id, name=self.name)
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self.link

    async def stop(self) -> None:
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        if self.link is not None:
            await self.link.close()
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()

    async def _watch(self) -> None:
        while not self._stopping and self._process is not None:
            code = await self._process.wait()
            if self._stopping:
                return
            print(f"radixgate serve: engine worker {self._process.pid} exited ({code}); "
                  "restarting", file=sys.stderr, flush=True)
            assert self.link is not None
            await self.link.mark_down()
            backoff = 1.0
            while not self._stopping:
                try:
                    process, client, stats = await self._spawn()
                except RuntimeError as exc:
                    print(f"radixgate serve: the engine worker did not start ({exc}); "
                          f"retrying in {backoff:.0f} s", file=sys.stderr, flush=True)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                self._process = process
                await self.link.replace(client, process.pid, stats.worker_id)
                self.link.name = self.name
                break

    async def _spawn(self) -> tuple[asyncio.subprocess.Process, EngineClient, Stats]:
        # A restarted worker takes its predecessor's port when it can, so other gateways
        # that route to this address (`serve --engine`) find it again.
        port = self._port if self._port is not None and _is_free(self._port) else free_port()
        self._port = None  # a failed start tries a fresh port next
        argv = [sys.executable, "-m", "gateway.cli", "engine", "--port", str(port),
                *self.engine_args]
        process = await asyncio.create_subprocess_exec(*argv, preexec_fn=_die_with_parent)
        if self.on_spawn is not None:
            self.on_spawn(process.pid)
        client = await EngineClient.connect(f"tcp://127.0.0.1:{port}")
        try:
            stats = await self._wait_ready(process, client)
        except BaseException:
            await client.close()
            if process.returncode is None:
                process.kill()
            raise
        self.name, self._port = f"tcp://127.0.0.1:{port}", port
        return process, client, stats

    async def _wait_ready(self, process: asyncio.subprocess.Process,
                          client: EngineClient) -> Stats:
        started = time.monotonic()
        while time.monotonic() - started < self.ready_timeout_s:
            if process.returncode is not None:
                raise RuntimeError(f"the engine worker exited with code {process.returncode}")
            try:
                stats = await client.stats(timeout_s=2.0)
            except TimeoutError:
                print(f"radixgate serve: waiting for the engine worker "
                      f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
                continue
            print(f"radixgate serve: engine worker {process.pid} ready ({stats.model}, "
                  f"{stats.num_pages} KV pages)", file=sys.stderr, flush=True)
            return stats
        raise RuntimeError(f"the engine worker did not answer in {self.ready_timeout_s:.0f} s")
