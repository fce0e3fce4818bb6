"""Async client of an engine: the same interface over a ZeroMQ worker or an in-process thread.

    async for msg in client.extend(Extend(...)):   # TokenChunk..., then Finished or Failed
        ...

Leaving the loop early (client disconnect, cancellation) aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

import zmq
import zmq.asyncio

from engine.errors import EngineShutdown
from engine.protocol import (
    Abort,
    Extend,
    Failed,
    Finished,
    Message,
    Pin,
    PrefixMatch,
    PrefixProbe,
    Stats,
    StatsRequest,
    TokenChunk,
    Unpin,
    decode,
    encode,
)

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.worker import EngineThread


class _Transport(Protocol):
    async def send(self, message: Message) -> None: ...

    async def close(self) -> None: ...


class EngineClient:
    """Routes engine replies to per-request queues. Use `connect` or `in_process` to build one."""

    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[Message]] = {}
        self._streams: set[str] = set()  # requests started and not yet ended or closed
        self._transport: _Transport | None = None
        self._closed = False

    @classmethod
    async def connect(cls, address: str) -> EngineClient:
        """A client of the worker at `address` (e.g. "tcp://127.0.0.1:5557")."""
        client = cls()
        client._transport = _ZmqTransport(address, client._dispatch)
        return client

    @classmethod
    def in_process(cls, engine: Engine) -> EngineClient:
        """A client driving `engine` in a thread of this process (must be called in a loop)."""
        client = cls()
        client._transport = _ThreadTransport(engine, client._dispatch,
                                             asyncio.get_running_loop())
        return client

    async def extend(self, request: Extend) -> AsyncIterator[TokenChunk | Finished | Failed]:
        replies = await self.start(request)
        try:
            async for message in replies:
                yield message
        finally:
            await replies.aclose()

    async def start(self, request: Extend) -> ReplyStream:
        """Send `request` now; its replies come from the returned stream, whose `aclose()`
        before the end aborts the request in the engine."""
        queue: asyncio.Queue[Message] = asyncio.Queue()
        self._queues[request.request_id] = queue
        self._streams.add(request.request_id)
        try:
            await self._send(request)
        except BaseException:
            self._forget(request.request_id)
            raise
        return ReplyStream(self, request.request_id, queue)

    @property
    def num_in_flight(self) -> int:
        """Requests this client started that have not ended (its share of the engine's load)."""
        return len(self._streams)

    def _forget(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        self._streams.discard(request_id)

    async def pin(self, turn_id: str, ttl_s: float) -> None:
        await self._send(Pin(turn_id, ttl_s))

    async def unpin(self, turn_id: str) -> None:
        await self._send(Unpin(turn_id))

    async def abort(self, request_id: str) -> None:
        await self._send(Abort(request_id))

    async def stats(self, timeout_s: float = 10.0) -> Stats:
        """The engine's counters. Raises TimeoutError, EngineShutdown (client closed)."""
        request_id = f"stats-{uuid.uuid4().hex}"
        message = await self._ask(StatsRequest(request_id), request_id, timeout_s)
        assert isinstance(message, Stats), f"expected Stats, got {type(message).__name__}"
        return message

    async def probe(self, namespace: str, token_ids: list[int],
                    timeout_s: float = 10.0, num_new_tokens: int = -1,
                    max_wait_s: float = 0.0, reserve_for: str = "") -> PrefixMatch:
        """How much of `token_ids` the engine holds cached, and its load: with the estimated
        wait for a turn computing `num_new_tokens` (-1: the uncached part of `token_ids`),
        reserved for the turn binding `reserve_for` when within `max_wait_s`
        (`PrefixProbe`). Raises TimeoutError, EngineShutdown."""
        request_id = f"probe-{uuid.uuid4().hex}"
        message = await self._ask(PrefixProbe(request_id, namespace, token_ids, num_new_tokens,
                                              max_wait_s, reserve_for), request_id, timeout_s)
        assert isinstance(message, PrefixMatch), f"expected PrefixMatch, got {message!r}"
        return message

    async def _ask(self, message: Message, request_id: str, timeout_s: float) -> Message:
        queue: asyncio.Queue[Message] = asyncio.Queue()
        self._queues[request_id] = queue
        try:
            await self._send(message)
            answer = await asyncio.wait_for(queue.get(), timeout_s)
        finally:
            self._queues.pop(request_id, None)
        if isinstance(answer, Failed):  # the client closed while waiting
            raise EngineShutdown(answer.message)
        return answer

    async def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            await self._transport.close()
        for request_id, queue in list(self._queues.items()):
            queue.put_nowait(Failed(request_id, EngineShutdown.error_type, "engine client closed"))

    async def _send(self, message: Message) -> None:
        if self._closed or self._transport is None:
            raise EngineShutdown("the engine client is closed")
        await self._transport.send(message)

    def _dispatch(self, message: Message) -> None:
        queue = self._queues.get(getattr(message, "request_id", ""))
        if queue is not None:
            queue.put_nowait(message)


class ReplyStream:
    """The replies of one started request: TokenChunk*, then Finished or Failed."""

    def __init__(self, client: EngineClient, request_id: str,
                 queue: asyncio.Queue[Message]) -> None:
        self._client = client
        self._request_id = request_id
        self._queue = queue
        self._done = False
        self._closed = False

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> TokenChunk | Finished | Failed:
        if self._done or self._closed:
            raise StopAsyncIteration
        while True:
            message = await self._queue.get()
            if isinstance(message, TokenChunk | Finished | Failed):
                if isinstance(message, Finished | Failed):
                    self._done = True
                    self._client._forget(self._request_id)
                return message

    async def aclose(self) -> None:
        """Stop following; a request that has not ended is aborted in the engine."""
        if self._closed:
            return
        self._closed = True
        self._client._forget(self._request_id)
        if not self._done and not self._client._closed:
            await self._client._send(Abort(self._request_id))


class _ThreadTransport:
    def __init__(self, engine: Engine, dispatch: _Dispatch, loop: asyncio.AbstractEventLoop
                 ) -> None:
        from engine.worker import EngineThread

        def send(_origin: object, message: Message) -> None:
            loop.call_soon_threadsafe(dispatch, message)

        self.thread: EngineThread = EngineThread(engine, send)
        self.thread.start()

    async def send(self, message: Message) -> None:
        # NOTE: the engine loop drops replies whose origin is None; any hashable non-None works.
        self.thread.put("in-process", message)

    async def close(self) -> None:
        await asyncio.to_thread(self.thread.stop)


class _Dispatch(Protocol):
    def __call__(self, message: Message) -> None: ...


class _ZmqTransport:
    def __init__(self, address: str, dispatch: _Dispatch) -> None:
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self.dispatch = dispatch
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def send(self, message: Message) -> None:
        await self.socket.send(encode(message))

    async def close(self) -> None:
        self.reader.cancel()
        self.socket.close()
        self.context.term()

    async def _read(self) -> None:
        while True:
            data = await self.socket.recv()
            self.dispatch(decode(data))
