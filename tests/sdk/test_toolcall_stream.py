"""Typed tool-call events and their accumulation, from a recorded transcript, for both twins."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

import sdk
from sdk._base import TurnSnapshot, accumulate_event
from sdk._sse import decode_text
from sdk._toolcalls import partial_arguments
from sdk.types import STREAM_EVENT_ADAPTER, StreamEvent
from tests.sdk.test_client_unit import make_client

RAW = (Path(__file__).parent / "fixtures" / "tool_call_turn.sse").read_text()
CALLS = [{"id": "call_a", "name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}},
         {"id": "call_b", "name": "search", "arguments": {}}]


def events() -> list[StreamEvent]:
    return [STREAM_EVENT_ADAPTER.validate_json(sse.data) for sse in decode_text(RAW)]


def test_events_are_typed_and_accumulate_partial_arguments() -> None:
    evs = events()
    assert [type(e).__name__ for e in evs] == [
        "TurnStart", "TextDelta", "ToolCallStart", "ToolCallDelta", "ToolCallDelta",
        "ToolCallDelta", "ToolCallEnd", "ToolCallStart", "ToolCallDelta", "ToolCallEnd",
        "TurnEnd"]
    snapshots = [TurnSnapshot()]
    for event in evs:
        snapshots.append(accumulate_event(snapshots[-1], event, None))
    first = snapshots[4].tool_calls[0]  # after the first fragment
    assert first.name == "get_weather" and first.arguments_json == '{"city": "Par'
    assert first.arguments == {"city": "Par"} and not first.is_done
    assert snapshots[5].tool_calls[0].arguments == {"city": "Paris", "days": [1, 2]}
    final = snapshots[-1]
    assert [c.to_dict() for c in final.tool_calls] == CALLS
    assert all(c.is_done for c in final.tool_calls)
    assert final.text == "Checking."
    assert final.turn is not None and final.turn.tool_calls == CALLS


def test_calls_sent_only_as_events_fill_the_final_turn() -> None:
    snapshot = TurnSnapshot()
    for event in events():
        if isinstance(event, sdk.TurnEnd):
            event = event.model_copy(update={"turn": event.turn.model_copy(
                update={"tool_calls": []})})
        snapshot = accumulate_event(snapshot, event, None)
    assert snapshot.turn is not None and snapshot.turn.tool_calls == CALLS


def test_partial_arguments() -> None:
    assert partial_arguments("") == {} and partial_arguments("{") == {}
    assert partial_arguments('{"a": [1, {"b": "x') == {"a": [1, {"b": "x"}]}
    assert partial_arguments("[1") == {}  # not an object


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_stream_exposes_tool_calls(sync: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert b'"tool_choice":"required"' in request.content.replace(b" ", b"")
        return httpx.Response(200, content=RAW.encode(),
                              headers={"content-type": "text/event-stream"})

    async def body() -> None:
        client = make_client(sync, handler)
        session_cls = sdk.Session if sync else sdk.AsyncSession
        session = session_cls(client, "s1")  # type: ignore[arg-type]
        stream = session.stream("weather?", tool_choice="required")
        if isinstance(stream, sdk.TurnStream):
            with stream as s:
                kinds = [type(e).__name__ for e in s]
                turn, snapshot = s.get_final_turn(), s.snapshot
        else:
            async with stream as a:
                kinds = [type(e).__name__ async for e in a]
                turn, snapshot = await a.get_final_turn(), a.snapshot
        assert kinds.count("ToolCallDelta") == 4 and kinds[-1] == "TurnEnd"
        assert turn.finish_reason == "tool_calls" and turn.tool_calls == CALLS
        assert [c.to_dict() for c in snapshot.tool_calls] == CALLS

    asyncio.run(body())
