"""The gateway's handle on its engine: the current client, swapped when a worker restarts.

    up ──worker dies──▶ down (requests in flight get Failed(engine_shutdown); new ones wait)
    down ──new worker ready──▶ up (`restarts` + 1)
    any ──close()──▶ closed (every wait ends with EngineUnavailable)

`live()` is awaited per request, so a restarted worker serves the next turn, and a turn that was
in flight when its worker died can run again on the new one (`gateway.generation`). A link that
no supervisor restarts (`restart_timeout_s=None`: an engine given to `create_app`) never waits:
a lost engine fails its requests at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from engine.client import EngineClient, ReplyStream
from engine.errors import EngineError
from engine.protocol import Extend, Failed, Finished, TokenChunk
from gateway.errors import EngineUnavailable


class EngineLink:
    """Holds the live `EngineClient` (and the worker's pid when the gateway spawned it)."""

    def __init__(self, client: EngineClient, *, pid: int | None = None,
                 timeout_s: float = 600.0, restart_timeout_s: float | None = None,
                 worker_id: str = "", name: str = "") -> None:
        self.client = client
        self.pid = pid
        self.worker_id = worker_id  # the engine's Stats.worker_id ('' until known)
        self.name = name  # how the gateway names it (an address), for logs and /readyz
        self.timeout_s = timeout_s
        self.restart_timeout_s = restart_timeout_s
        self.restarts = 0
        self._up = asyncio.Event()
        self._up.set()
        self._closed = False

    @property
    def is_supervised(self) -> bool:
        """True when a lost worker is replaced, so a failed request may run again."""
        return self.restart_timeout_s is not None and not self._closed

    @property
    def is_up(self) -> bool:
        return self._up.is_set() and not self._closed

    async def mark_down(self) -> None:
        """The worker died: fail its requests in flight and hold new ones until `replace`."""
        self._up.clear()
        self.pid = None
        await self.client.close()

    async def replace(self, client: EngineClient, pid: int | None, worker_id: str = "") -> None:
        """Point at a new worker; closing the old client fails its requests in flight."""
        old, self.client, self.pid = self.client, client, pid
        self.worker_id = worker_id
        self.restarts += 1
        self._up.set()
        await old.close()

    async def close(self) -> None:
        """The gateway is stopping: no request waits for a worker any more."""
        self._closed = True
        self._up.set()  # wake the waiters, who then see `_closed`
        await self.client.close()

    async def live(self) -> EngineClient:
        """The client of a running worker, waiting up to `restart_timeout_s` while one restarts.
        Raises EngineUnavailable (503) when none comes back in time or the link is closed."""
        if not self._up.is_set() and self.restart_timeout_s is not None:
            try:
                async with asyncio.timeout(self.restart_timeout_s):
                    await self._up.wait()
            except TimeoutError as exc:
                raise EngineUnavailable(
                    f"the engine worker did not come back within {self.restart_timeout_s:.0f} s"
                ) from exc
        if self._closed:
            raise EngineUnavailable("the gateway is shutting down")
        return self.client

    async def extend(self, request: Extend
                     ) -> AsyncGenerator[TokenChunk | Finished | Failed, None]:
        """The engine's replies; EngineUnavailable if none comes for `timeout_s`. Closing this
        generator early aborts the request in the engine."""
        replies = await self.start(request)
        try:
            async for message in self.follow(replies):
                yield message
        finally:
            await replies.aclose()

    async def start(self, request: Extend) -> ReplyStream:
        """Send `request` to a live worker now (see `EngineClient.start`)."""
        client = await self.live()
        return await client.start(request)

    async def follow(self, replies: ReplyStream
                     ) -> AsyncGenerator[TokenChunk | Finished | Failed, None]:
        """`replies`, with EngineUnavailable when none comes for `timeout_s`."""
        while True:
            try:
                async with asyncio.timeout(self.timeout_s):
                    message = await anext(replies)
            except StopAsyncIteration:
                return
            except TimeoutError as exc:
                raise EngineUnavailable(
                    f"the engine did not answer within {self.timeout_s:.0f} s") from exc
            yield message

    async def pin(self, ref: str, ttl_s: float) -> None:
        """Best effort: a pin is an optimisation, never a reason to fail a turn."""
        if not self.is_up:
            return
        try:
            await self.client.pin(ref, ttl_s)
        except EngineError:
            pass

    async def unpin(self, ref: str) -> None:
        if not self.is_up:
            return
        try:
            await self.client.unpin(ref)
        except EngineError:
            pass
