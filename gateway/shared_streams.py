"""Streams that several requests can follow: a retried stream with the same Idempotency-Key
joins the one still running instead of generating again.

The turn's SSE frames are pumped by a task of their own into a log; every request following the
stream (the first one and any retry that joins) reads the log from the start, or after its
`Last-Event-ID`, and then waits for more. When the last follower leaves (client disconnects),
the turn is aborted (after `grace_s`, 0 by default: a client that closes its stream means it, and
the engine's time is not spent on the chance of a reconnect). One registry per app
(`State.streams`); a retry that reaches another gateway replica gets 409 `conflict` as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from contextlib import aclosing

GRACE_S = 0.0  # how long a stream nobody follows runs on, waiting for a retry to join


class SharedStream:
    """One running stream's frames. Use `follow()`; the pump starts with the first follower."""

    def __init__(self, frames: AsyncGenerator[bytes, None], *, grace_s: float) -> None:
        self._source = frames
        self._grace_s = grace_s
        self.frames: list[bytes] = []
        self.done = False
        self._changed = asyncio.Condition()
        self._num_followers = 0
        self._pump: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def follow(self, after_event_id: str | None = None) -> AsyncGenerator[bytes, None]:
        """Every frame (those after `after_event_id` when it names one), then the new ones as
        they come, until the stream ends. Leaving early does not stop the stream at once."""
        self._num_followers += 1
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._run())
        index = _index_after(self.frames, after_event_id)
        try:
            while True:
                async with self._changed:
                    while index >= len(self.frames) and not self.done:
                        await self._changed.wait()
                    batch = self.frames[index:]
                    finished = self.done
                index += len(batch)
                for frame in batch:
                    yield frame
                if finished and index >= len(self.frames):
                    return
        finally:
            self._num_followers -= 1
            if self._num_followers == 0 and not self.done:
                self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _run(self) -> None:
        try:
            async with aclosing(self._source):
                async for frame in self._source:
                    async with self._changed:
                        self.frames.append(frame)
                        self._changed.notify_all()
        finally:
            async with self._changed:
                self.done = True
                self._changed.notify_all()
            if not self.ended.done():
                self.ended.set_result(None)

    async def _reap(self) -> None:
        await asyncio.sleep(self._grace_s)
        if self._num_followers == 0 and self._pump is not None:
            self._pump.cancel()  # closes the source: the engine request is aborted
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump


class SharedStreams:
    """The running shared streams of one app, by idempotency record key."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._running: dict[str, SharedStream] = {}

    def get(self, key: str) -> SharedStream | None:
        return self._running.get(key)

    def start(self, key: str, frames: AsyncGenerator[bytes, None]) -> SharedStream:
        """Register `frames` under `key` until they end; returns the shared stream."""
        stream = SharedStream(frames, grace_s=self.grace_s)
        self._running[key] = stream
        stream.ended.add_done_callback(lambda _: self._running.pop(key, None))
        return stream

    @property
    def num_running(self) -> int:
        return len(self._running)


def _index_after(frames: list[bytes], event_id: str | None) -> int:
    """Position after the frame whose SSE id is `event_id` (0 when absent or unknown)."""
    if event_id:
        marker = f"id: {event_id}\n".encode()
        for i, frame in enumerate(frames):
            if frame.startswith(marker):
                return i + 1
    return 0
