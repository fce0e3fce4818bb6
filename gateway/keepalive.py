"""Timed SSE keep-alives: a long prefill (or a worker restart) can leave a stream silent for
minutes, and proxies and clients drop connections that say nothing for too long."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from contextlib import aclosing

SSE_COMMENT_PING = b": ping\n\n"  # a comment line: every SSE parser skips it
ANTHROPIC_PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # the Messages API's own event
_END = b""  # the source is exhausted (no SSE frame is empty)


async def keepalive(frames: AsyncGenerator[bytes, None], interval_s: float,
                    ping: bytes) -> AsyncGenerator[bytes, None]:
    """`frames` unchanged, with `ping` sent whenever `interval_s` passes without a frame.
    Closing this generator (a client disconnect) closes `frames`.

    A pump task moves the frames into a queue and one timer, re-armed by each frame, drops a
    ping into it: per frame that costs a queue hand-off, not a task and a wait."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
    timer: list[asyncio.TimerHandle] = []

    def arm() -> None:
        if timer:
            timer[0].cancel()
        timer[:] = [loop.call_later(interval_s, on_silence)]

    def on_silence() -> None:
        queue.put_nowait(ping)
        arm()

    async def pump() -> None:
        try:
            async with aclosing(frames):
                async for frame in frames:
                    queue.put_nowait(frame)
                    arm()
            queue.put_nowait(_END)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait(exc)

    arm()
    task = loop.create_task(pump())
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is _END or item == _END:
                return
            yield item
    finally:
        timer[0].cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
