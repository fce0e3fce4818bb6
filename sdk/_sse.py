"""WHATWG `text/event-stream` decoding as pure functions, shared by both clients.

Two steps, kept apart from JSON and from types:
- `split_lines(pending, chunk)`: text chunks → complete lines (CRLF, LF or CR), carrying the rest;
- `decode_line(state, line)`: one line → the new parser state and the event it completes, if any.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ServerSentEvent:
    event: str
    data: str
    id: str | None = None
    retry: int | None = None


@dataclass(frozen=True)
class SSEState:
    """Parser state between lines. `last_event_id` survives dispatches (per the spec)."""

    data: tuple[str, ...] = ()
    event: str = ""
    last_event_id: str | None = None
    retry: int | None = None
    has_data: bool = False


def split_lines(pending: str, chunk: str) -> tuple[list[str], str]:
    """Complete lines of `pending + chunk`, and what is left for the next call.

    A trailing CR is held back: the next chunk may start with the LF of a CRLF pair.
    At the end of the stream pass the rest to `finish_lines`; a final line without a
    terminator never completes an event (the spec discards it)."""
    text = pending + chunk
    lines: list[str] = []
    start = 0
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\n":
            lines.append(text[start:i])
            start = i + 1
        elif ch == "\r":
            if i + 1 == n:
                break  # maybe half of a CRLF
            lines.append(text[start:i])
            if text[i + 1] == "\n":
                i += 1
            start = i + 1
        i += 1
    return lines, text[start:]


def decode_line(state: SSEState, line: str) -> tuple[SSEState, ServerSentEvent | None]:
    """Apply one line (without its terminator) to `state`. Does not mutate `state`."""
    if not line:
        if not state.has_data:
            return SSEState(last_event_id=state.last_event_id, retry=state.retry), None
        event = ServerSentEvent(event=state.event or "message", data="\n".join(state.data),
                                id=state.last_event_id, retry=state.retry)
        return SSEState(last_event_id=state.last_event_id, retry=state.retry), event
    if line.startswith(":"):
        return state, None
    field, sep, value = line.partition(":")
    if sep and value.startswith(" "):
        value = value[1:]
    if field == "data":
        return replace(state, data=(*state.data, value), has_data=True), None
    if field == "event":
        return replace(state, event=value), None
    if field == "id":
        return (state, None) if "\0" in value else (replace(state, last_event_id=value), None)
    if field == "retry" and value.isascii() and value.isdigit():
        return replace(state, retry=int(value)), None
    return state, None


def finish_lines(rest: str) -> list[str]:
    """At the end of the stream: the held-back line if it was terminated by a lone CR."""
    return [rest[:-1]] if rest.endswith("\r") else []


def strip_bom(text: str) -> str:
    return text[1:] if text.startswith("\ufeff") else text


def decode_text(text: str) -> list[ServerSentEvent]:
    """Every complete event of a whole stream body (tests and recorded transcripts)."""
    lines, rest = split_lines("", strip_bom(text))
    lines += finish_lines(rest)
    state = SSEState()
    events: list[ServerSentEvent] = []
    for line in lines:
        state, event = decode_line(state, line)
        if event is not None:
            events.append(event)
    return events


def iter_sse(chunks: Iterable[str]) -> Iterator[ServerSentEvent]:
    """Events of a stream of text chunks (`httpx.Response.iter_text()`)."""
    state, pending, first = SSEState(), "", True
    for chunk in chunks:
        if first and chunk:
            chunk, first = strip_bom(chunk), False
        lines, pending = split_lines(pending, chunk)
        for line in lines:
            state, event = decode_line(state, line)
            if event is not None:
                yield event
    for line in finish_lines(pending):
        state, event = decode_line(state, line)
        if event is not None:
            yield event


async def aiter_sse(chunks: AsyncIterable[str]) -> AsyncIterator[ServerSentEvent]:
    """Async twin of `iter_sse` (`httpx.Response.aiter_text()`)."""
    state, pending, first = SSEState(), "", True
    async for chunk in chunks:
        if first and chunk:
            chunk, first = strip_bom(chunk), False
        lines, pending = split_lines(pending, chunk)
        for line in lines:
            state, event = decode_line(state, line)
            if event is not None:
                yield event
    for line in finish_lines(pending):
        state, event = decode_line(state, line)
        if event is not None:
            yield event
