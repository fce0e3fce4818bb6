"""The gateway's handle on its engine: the current client, swapped when a worker restarts.

`EngineLink.client` is read per request, so a restarted worker (new client) serves the next turn;
requests in flight on a dead worker fail with `engine_shutdown` (503) when the old client closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import cast

from engine.client import EngineClient
from engine.errors import EngineError
from engine.protocol import Extend, Failed, Finished, TokenChunk
from gateway.errors import EngineUnavailable


class EngineLink:
    """Holds the live `EngineClient` (and the worker's pid when the gateway spawned it)."""

    def __init__(self, client: EngineClient, *, pid: int | None = None,
                 timeout_s: float = 600.0) -> None:
        self.client = client
        self.pid = pid
        self.timeout_s = timeout_s
        self.restarts = 0

    async def replace(self, client: EngineClient, pid: int | None) -> None:
        """Point at a new worker; closing the old client fails its requests in flight."""
        old, self.client, self.pid = self.client, client, pid
        self.restarts += 1
        await old.close()

    async def extend(self, request: Extend
                     ) -> AsyncGenerator[TokenChunk | Finished | Failed, None]:
        """The engine's replies; EngineUnavailable if none comes for `timeout_s`. Closing this
        generator early aborts the request in the engine."""
        stream = cast(AsyncGenerator[TokenChunk | Finished | Failed, None],
                      self.client.extend(request))
        async with aclosing(stream):
            while True:
                try:
                    async with asyncio.timeout(self.timeout_s):
                        message = await anext(stream)
                except StopAsyncIteration:
                    return
                except TimeoutError as exc:
                    raise EngineUnavailable(
                        f"the engine did not answer within {self.timeout_s:.0f} s") from exc
                yield message

    async def pin(self, ref: str, ttl_s: float) -> None:
        """Best effort: a pin is an optimisation, never a reason to fail a turn."""
        try:
            await self.client.pin(ref, ttl_s)
        except EngineError:
            pass

    async def unpin(self, ref: str) -> None:
        try:
            await self.client.unpin(ref)
        except EngineError:
            pass
