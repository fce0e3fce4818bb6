"""SSE keep-alives: a ping whenever the stream has been silent for the interval; the frames
themselves pass unchanged and in order, and closing the stream closes its source."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from gateway.keepalive import SSE_COMMENT_PING, keepalive

PING = SSE_COMMENT_PING


def test_pings_fill_silences_and_frames_pass_unchanged() -> None:
    async def source() -> AsyncGenerator[bytes, None]:
        yield b"a"
        await asyncio.sleep(0.5)  # a long prefill: many intervals without a frame
        yield b"b"
        yield b"c"

    async def main() -> list[bytes]:
        return [frame async for frame in keepalive(source(), 0.05, PING)]

    out = asyncio.run(main())
    assert [f for f in out if f != PING] == [b"a", b"b", b"c"]
    assert out[0] == b"a" and out.index(b"b") > 1  # the pings sit in the silence
    assert out[-2:] == [b"b", b"c"]


def test_no_ping_when_frames_keep_coming() -> None:
    async def source() -> AsyncGenerator[bytes, None]:
        for i in range(5):
            yield bytes([i])

    async def main() -> list[bytes]:
        return [frame async for frame in keepalive(source(), 30.0, PING)]

    assert asyncio.run(main()) == [bytes([i]) for i in range(5)]


def test_closing_closes_the_source_even_while_it_waits() -> None:
    closed = asyncio.Event()

    async def main() -> None:
        async def source() -> AsyncGenerator[bytes, None]:
            try:
                yield b"a"
                await asyncio.sleep(60)
                yield b"never"
            finally:
                closed.set()

        stream = keepalive(source(), 0.01, PING)
        assert await anext(stream) == b"a"
        assert await anext(stream) == PING  # the source is now blocked in its sleep
        await stream.aclose()
        assert closed.is_set()

    asyncio.run(main())
