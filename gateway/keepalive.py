"""Timed SSE keep-alives: a long prefill (or a worker restart) can leave a stream silent for
minutes, and proxies and clients drop connections that say nothing for too long."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from contextlib import aclosing

SSE_COMMENT_PING = b": ping\n\n"  # a comment line: every SSE parser skips it
ANTHROPIC_PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # the Messages API's own event


async def keepalive(frames: AsyncGenerator[bytes, None], interval_s: float,
                    ping: bytes) -> AsyncGenerator[bytes, None]:
    """`frames` unchanged, with `ping` sent whenever `interval_s` passes without a frame.
    Closing this generator (a client disconnect) closes `frames`."""
    async with aclosing(frames):
        pending: asyncio.Future[bytes] = asyncio.ensure_future(anext(frames))
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=interval_s)
                if not done:
                    yield ping
                    continue
                try:
                    frame = pending.result()
                except StopAsyncIteration:
                    return
                yield frame
                pending = asyncio.ensure_future(anext(frames))
        finally:
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await pending
