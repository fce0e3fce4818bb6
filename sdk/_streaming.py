"""`TurnStream` / `AsyncTurnStream`: one streamed turn as a context manager of typed events.

The twins differ only in `async`/`await`; decoding (`sdk._sse`) and accumulation
(`sdk._base.accumulate_event`) are shared pure functions. The response is closed on exit. A
stream that has started is never sent again, with one exception: when the server ends it with
a `turn_interrupted` error (its engine worker restarted), the same request (same Idempotency-Key,
`Last-Event-ID`) is sent again and its events continue the turn where it stopped, so the caller
sees one uninterrupted stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import TracebackType

import httpx

from sdk._base import TurnSnapshot, accumulate_event, parse_event, transport_error
from sdk._constants import MAX_STREAM_CONTINUATIONS
from sdk._errors import APIError, APIStatusError, is_continuable
from sdk._sse import aiter_sse, iter_sse
from sdk.types import StreamEvent, TextDelta, Turn, TurnEnd


def _final_turn(snapshot: TurnSnapshot, request: httpx.Request | None) -> Turn:
    if snapshot.turn is None:
        raise APIError("the stream ended without a turn_end event", request)
    return snapshot.turn


class TurnStream:
    """Iterate for events; `.text_stream` for text only; `.get_final_turn()` for the turn."""

    def __init__(self, open_response: Callable[[], httpx.Response], *,
                 on_turn: Callable[[Turn], object] | None = None,
                 reopen: Callable[[str | None], httpx.Response] | None = None) -> None:
        self._open = open_response
        self._reopen = reopen
        self._on_turn = on_turn
        self._response: httpx.Response | None = None
        self._events: Iterator[StreamEvent] | None = None
        self.snapshot = TurnSnapshot()

    def __enter__(self) -> TurnStream:
        self._response = self._open()
        self._events = self._iter_events(self._response)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._response is not None:
            self._response.close()

    def _iter_events(self, response: httpx.Response) -> Iterator[StreamEvent]:
        for attempt in range(MAX_STREAM_CONTINUATIONS + 1):
            try:
                for sse in iter_sse(response.iter_text()):
                    event = parse_event(sse, response.request)
                    if event is not None:
                        self.snapshot = accumulate_event(self.snapshot, event, sse.id)
                        if isinstance(event, TurnEnd) and self._on_turn is not None:
                            self._on_turn(event.turn)
                        yield event
                return
            except APIStatusError as exc:
                if (self._reopen is None or not is_continuable(exc)
                        or attempt == MAX_STREAM_CONTINUATIONS):
                    raise
            except httpx.TransportError as exc:
                raise transport_error(exc, response.request) from exc
            finally:
                response.close()
            response = self._response = self._reopen(self.snapshot.last_event_id)

    def __iter__(self) -> Iterator[StreamEvent]:
        if self._events is None:
            raise RuntimeError("use the stream as a context manager: `with session.stream(...)`")
        return self._events

    @property
    def text_stream(self) -> Iterator[str]:
        for event in self:
            if isinstance(event, TextDelta):
                yield event.text

    def until_done(self) -> None:
        for _ in self:
            pass

    def get_final_turn(self) -> Turn:
        """Consumes the rest of the stream; raises APIError if it ended without a turn."""
        self.until_done()
        return _final_turn(self.snapshot, self._response.request if self._response else None)

    def get_final_text(self) -> str:
        self.until_done()
        return self.snapshot.text


class AsyncTurnStream:
    """Async twin of `TurnStream`."""

    def __init__(self, open_response: Callable[[], Awaitable[httpx.Response]], *,
                 on_turn: Callable[[Turn], object] | None = None,
                 reopen: Callable[[str | None], Awaitable[httpx.Response]] | None = None
                 ) -> None:
        self._open = open_response
        self._reopen = reopen
        self._on_turn = on_turn
        self._response: httpx.Response | None = None
        self._events: AsyncIterator[StreamEvent] | None = None
        self.snapshot = TurnSnapshot()

    async def __aenter__(self) -> AsyncTurnStream:
        self._response = await self._open()
        self._events = self._iter_events(self._response)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._response is not None:
            await self._response.aclose()

    async def _iter_events(self, response: httpx.Response) -> AsyncIterator[StreamEvent]:
        for attempt in range(MAX_STREAM_CONTINUATIONS + 1):
            try:
                async for sse in aiter_sse(response.aiter_text()):
                    event = parse_event(sse, response.request)
                    if event is not None:
                        self.snapshot = accumulate_event(self.snapshot, event, sse.id)
                        if isinstance(event, TurnEnd) and self._on_turn is not None:
                            self._on_turn(event.turn)
                        yield event
                return
            except APIStatusError as exc:
                if (self._reopen is None or not is_continuable(exc)
                        or attempt == MAX_STREAM_CONTINUATIONS):
                    raise
            except httpx.TransportError as exc:
                raise transport_error(exc, response.request) from exc
            finally:
                await response.aclose()
            response = self._response = await self._reopen(self.snapshot.last_event_id)

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        if self._events is None:
            raise RuntimeError("use the stream as a context manager: `async with ...`")
        return self._events

    @property
    async def text_stream(self) -> AsyncIterator[str]:
        async for event in self:
            if isinstance(event, TextDelta):
                yield event.text

    async def until_done(self) -> None:
        async for _ in self:
            pass

    async def get_final_turn(self) -> Turn:
        """Consumes the rest of the stream; raises APIError if it ended without a turn."""
        await self.until_done()
        return _final_turn(self.snapshot, self._response.request if self._response else None)

    async def get_final_text(self) -> str:
        await self.until_done()
        return self.snapshot.text
