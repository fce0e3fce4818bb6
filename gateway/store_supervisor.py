"""The embedded Valkey that `radixgate serve` owns, supervised like the engine worker.

When the server dies (a crash, an OOM kill, `kill -9`), the supervisor starts it again on the same
port and data dir: it replays its AOF, and the gateway's Redis pool reconnects to the same URL.
While it is down, requests fail with `503 store_unavailable` and `Retry-After` (gateway.errors),
and `/readyz` says so. With `appendfsync always` every acknowledged write is on disk before its
reply, so a restart loses nothing that a client was told succeeded.

The server is spawned from the event-loop thread (the main thread of `serve`), because its
parent-death signal is tied to the thread that forked it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

from sessions.embedded import EmbeddedServerError, EmbeddedValkey

POLL_S = 0.1  # how often the supervisor looks at the server process
MAX_BACKOFF_S = 5.0  # between restarts that fail in a row


class StoreSupervisor:
    """Keeps one EmbeddedValkey running. `on_spawn(pid)` is called for each new process."""

    def __init__(self, valkey: EmbeddedValkey, *,
                 on_spawn: Callable[[int], None] | None = None) -> None:
        self.valkey = valkey
        self.on_spawn = on_spawn
        self.num_restarts = 0
        self.down_since: float | None = None  # time.monotonic() of the last death, while down
        self._watcher: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.valkey.pid

    def start(self) -> None:
        """Watch the (already started) server from the running loop."""
        if self.on_spawn is not None and self.valkey.pid is not None:
            self.on_spawn(self.valkey.pid)
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        """Stop watching and shut the server down gracefully (its AOF is flushed)."""
        if self._watcher is not None:
            self._watcher.cancel()
            try:
                await self._watcher
            except asyncio.CancelledError:
                pass
        await asyncio.to_thread(self.valkey.stop)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            if self.valkey.is_running:
                continue
            self.down_since = time.monotonic()
            print(f"radixgate serve: the embedded Valkey (pid {self.valkey.pid}) died; "
                  "restarting it from its AOF", file=sys.stderr, flush=True)
            await self._restart()
            self.down_since = None

    async def _restart(self) -> None:
        backoff = POLL_S
        while True:
            try:
                # Spawned here, on the loop thread (see the module docstring); waiting for PING
                # (the AOF replay) happens in a thread so streaming turns keep flowing.
                self.valkey.respawn()
                await asyncio.to_thread(self.valkey.wait_ready)
            except EmbeddedServerError as exc:
                print(f"radixgate serve: restarting Valkey failed ({exc}); retrying in "
                      f"{backoff:.1f} s", file=sys.stderr, flush=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            self.num_restarts += 1
            if self.on_spawn is not None and self.valkey.pid is not None:
                self.on_spawn(self.valkey.pid)
            print(f"radixgate serve: Valkey is back (pid {self.valkey.pid}, "
                  f"{self.valkey.url})", file=sys.stderr, flush=True)
            return
