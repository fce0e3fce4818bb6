"""The incremental tool-call parser: the same events however the text is split."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.toolcall_parser import (
    ParseEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallParser,
    ToolCallStart,
)

CALL_A = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris \\"x\\"", '
          '"days": [1, {"k": "]"}], "u": "</tool_call>"}}\n</tool_call>')
ARGS_A = '{"city": "Pa}ris \\"x\\"", "days": [1, {"k": "]"}], "u": "</tool_call>"}'
CALL_B = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'

CASES = {
    "text only": "Hello there, <tool no tag> and < tool_call>.\n",
    "one call": CALL_A,
    "text then call": "Let me check.\n" + CALL_A,
    "two calls and text": "Sure. " + CALL_A + "\n" + CALL_B + "\n\nDone.  ",
    "whole body, other key order": '<tool_call>{"arguments": {"x": 1}, "name": "g"}</tool_call>ok',
    "bad body kept as text": "a<tool_call>not json</tool_call>b",
    "unfinished call dropped": "Hi " + CALL_A[:60],
    "unicode": "Météo ☀ " + '<tool_call>\n{"name": "w", "arguments": {"v": "日本"}}\n</tool_call>',
}


def ids() -> Iterable[str]:
    return (f"call_{i}" for i in itertools.count())


def run(pieces: Iterable[str]) -> tuple[list[ParseEvent], ToolCallParser]:
    it = ids()
    parser = ToolCallParser(lambda: next(it))
    events: list[ParseEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.finish()
    return events, parser


def normalized(events: list[ParseEvent]) -> list[object]:
    """Events with adjacent text deltas, and adjacent argument deltas of one call, merged."""
    out: list[object] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + event.text)
        elif (isinstance(event, ToolCallDelta) and isinstance(last, ToolCallDelta)
              and last.index == event.index):
            out[-1] = ToolCallDelta(last.index, last.arguments + event.arguments)
        else:
            out.append(event)
    return out


def check_contract(events: list[ParseEvent], parser: ToolCallParser) -> None:
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == parser.text
    ends = {e.index: e for e in events if isinstance(e, ToolCallEnd)}
    for index, end in ends.items():
        fragments = "".join(e.arguments for e in events
                            if isinstance(e, ToolCallDelta) and e.index == index)
        assert json.loads(fragments) == end.arguments
    assert [c.arguments for c in parser.tool_calls] == [e.arguments for e in ends.values()]
    assert all(e.arguments != "" for e in events if isinstance(e, ToolCallDelta))


def test_one_call_with_text() -> None:
    events, parser = run(["Let me check.\n" + CALL_A])
    assert normalized(events) == [
        TextDelta("Let me check."),
        ToolCallStart(0, "call_0", "get_weather"),
        ToolCallDelta(0, ARGS_A),
        ToolCallEnd(0, "call_0", "get_weather", json.loads(ARGS_A)),
    ]
    assert parser.text == "Let me check."
    assert [c.to_dict() for c in parser.tool_calls] == [
        {"id": "call_0", "name": "get_weather", "arguments": json.loads(ARGS_A)}]


def test_whitespace_touching_tags_is_markup() -> None:
    _, parser = run(["Sure. " + CALL_A + "\n" + CALL_B + "\n\nDone.  "])
    assert parser.text == "Sure.Done.  "
    assert [c.name for c in parser.tool_calls] == ["get_weather", "f"]
    assert [c.id for c in parser.tool_calls] == ["call_0", "call_1"]


def test_other_key_order_is_parsed_whole() -> None:
    events, parser = run([CASES["whole body, other key order"]])
    assert normalized(events) == [ToolCallStart(0, "call_0", "g"), ToolCallDelta(0, '{"x": 1}'),
                                  ToolCallEnd(0, "call_0", "g", {"x": 1}), TextDelta("ok")]
    assert parser.text == "ok"


def test_bad_body_is_text_and_unfinished_call_is_dropped() -> None:
    _, bad = run([CASES["bad body kept as text"]])
    assert bad.text == "a<tool_call>not json</tool_call>b" and not bad.tool_calls
    events, cut = run([CASES["unfinished call dropped"]])
    assert cut.text == "Hi" and not cut.tool_calls
    assert any(isinstance(e, ToolCallStart) for e in events)  # streamed, never ended
    assert not any(isinstance(e, ToolCallEnd) for e in events)


def test_text_that_only_looks_like_a_tag_is_released() -> None:
    events, parser = run(["Hello <tool", "_cal", "l? no"])
    assert parser.text == "Hello <tool_call? no" and not parser.tool_calls
    assert normalized(events) == [TextDelta("Hello <tool_call? no")]


@pytest.mark.parametrize("name", list(CASES))
def test_every_two_piece_split_gives_the_same_events(name: str) -> None:
    text = CASES[name]
    whole, whole_parser = run([text])
    check_contract(whole, whole_parser)
    for cut in range(len(text) + 1):
        events, parser = run([text[:cut], text[cut:]])
        assert normalized(events) == normalized(whole), f"split at {cut}"
        assert parser.text == whole_parser.text
        assert parser.tool_calls == whole_parser.tool_calls
    chars, _ = run(list(text))
    assert normalized(chars) == normalized(whole)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(CASES)), st.lists(st.integers(0, 400), max_size=12))
def test_random_splits_give_the_same_events(name: str, cuts: list[int]) -> None:
    text = CASES[name]
    bounds = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    events, parser = run(pieces)
    whole, _ = run([text])
    assert normalized(events) == normalized(whole)
    check_contract(events, parser)
