"""Responses running on this gateway, by id: what `POST /v1/responses/{id}/cancel` stops, and
what a background response runs in.

Each run is an asyncio task that drives the turn and stores the result; a stream or a waiting
request only reads its events (`RunEvents`). Cancelling the task aborts the engine request and
the driver stores the response as cancelled. `aclose` cancels whatever still runs when the app
stops, so no engine request outlives it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

_END: Any = object()  # the queue's end marker


class RunEvents:
    """The events of one run, for one reader: `put` them (never blocks), then `close`."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, event: dict[str, Any]) -> None:
        self._queue.put_nowait(event)

    def close(self) -> None:
        self._queue.put_nowait(_END)

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        while (event := await self._queue.get()) is not _END:
            yield event


class ResponseRuns:
    """One per app. Not thread-safe: used from the event loop only."""

    def __init__(self) -> None:
        self._tasks: dict[str, tuple[str, asyncio.Task[Any]]] = {}

    def start(self, tenant: str, response_id: str,
              driver: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `driver` (it stores and returns the finished response) as the response's task."""
        task = asyncio.create_task(driver, name=f"response {response_id}")
        self._tasks[response_id] = (tenant, task)
        task.add_done_callback(lambda _: self._tasks.pop(response_id, None))
        return task

    def running(self, tenant: str, response_id: str) -> asyncio.Task[Any] | None:
        """The task of a response of `tenant` still running here, if any."""
        entry = self._tasks.get(response_id)
        return entry[1] if entry is not None and entry[0] == tenant else None

    async def aclose(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
