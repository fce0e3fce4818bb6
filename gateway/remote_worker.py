"""An engine worker the gateway did not start (`radixgate serve --engine tcp://host:port`),
watched by a heartbeat: a stats request every `interval_s`.

    up ──`max_misses` unanswered──▶ down (the link's requests in flight fail with
                                    engine_shutdown; the pool routes around it)
    down ──a fresh connection answers──▶ up (with the worker's id: a restarted worker is a
                                         new one and holds no KV)
    up ──answers with a new worker id──▶ reconnected (restarted at the same address: the old
                                         connection's requests fail, their turns go on)

Whoever runs that worker (systemd, Kubernetes, another `radixgate engine`) restarts it; the
gateway only notices.
"""

from __future__ import annotations

import asyncio
import sys

from engine.client import EngineClient
from engine.errors import EngineError
from gateway.engine_link import EngineLink


class RemoteWorker:
    def __init__(self, address: str, *, timeout_s: float = 600.0, interval_s: float = 1.0,
                 probe_timeout_s: float = 5.0, max_misses: int = 3) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.probe_timeout_s = probe_timeout_s
        self.max_misses = max_misses
        self.link: EngineLink | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def start(self, ready_timeout_s: float = 300.0) -> EngineLink:
        """Connect and wait until the worker answers. Raises RuntimeError if it does not
        within `ready_timeout_s`."""
        client = await EngineClient.connect(self.address)
        try:
            async with asyncio.timeout(ready_timeout_s):
                while True:
                    try:
                        stats = await client.stats(timeout_s=self.probe_timeout_s)
                        break
                    except TimeoutError:
                        print(f"radixgate serve: waiting for the engine at {self.address}",
                              file=sys.stderr, flush=True)
        except TimeoutError as exc:
            await client.close()
            raise RuntimeError(f"the engine at {self.address} did not answer in "
                               f"{ready_timeout_s:.0f} s") from exc
        self.link = EngineLink(client, timeout_s=self.timeout_s, worker_id=stats.worker_id,
                               name=self.address)
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self.link

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self.link is not None:
            await self.link.close()

    async def _watch(self) -> None:
        link = self.link
        assert link is not None
        misses = 0
        while True:
            await asyncio.sleep(self.interval_s)
            if link.is_up:
                try:
                    stats = await link.client.stats(timeout_s=self.probe_timeout_s)
                    misses = 0
                    if stats.worker_id != link.worker_id:  # restarted at the same address
                        await self._reconnect(link)
                except (TimeoutError, EngineError):
                    misses += 1
                    if misses >= self.max_misses:
                        print(f"radixgate serve: the engine at {self.address} stopped "
                              "answering; routing around it", file=sys.stderr, flush=True)
                        await link.mark_down()
                continue
            if await self._reconnect(link):
                misses = 0
                print(f"radixgate serve: the engine at {self.address} answers again",
                      file=sys.stderr, flush=True)

    async def _reconnect(self, link: EngineLink) -> bool:
        """Swap in a fresh connection once the worker answers on it. The old one's requests in
        flight fail with engine_shutdown (a restarted worker never answers them), so their
        turns go on elsewhere."""
        client = await EngineClient.connect(self.address)
        try:
            stats = await client.stats(timeout_s=self.probe_timeout_s)
        except (TimeoutError, EngineError):
            await client.close()
            return False
        await link.replace(client, None, stats.worker_id)
        return True
