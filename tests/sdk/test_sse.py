"""The WHATWG SSE decoder: fields, comments, multi-line data, CR/LF/CRLF, chunk boundaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdk._sse import ServerSentEvent, SSEState, decode_line, decode_text, iter_sse, split_lines

FIXTURES = Path(__file__).parent / "fixtures"


def test_multi_line_data_is_joined_with_newlines() -> None:
    events = decode_text("event: e\ndata: one\ndata:two\ndata:  three\n\n")
    assert events == [ServerSentEvent(event="e", data="one\ntwo\n three")]


def test_comments_and_unknown_fields_are_ignored() -> None:
    events = decode_text(": hello\nfoo: bar\ndata: x\n: mid\n\n")
    assert events == [ServerSentEvent(event="message", data="x")]


@pytest.mark.parametrize("eol", ["\n", "\r", "\r\n"], ids=["lf", "cr", "crlf"])
def test_line_endings(eol: str) -> None:
    text = eol.join(["id: 7", "event: a", "data: 1", "", "data: 2", "", ""])
    events = decode_text(text)
    assert [(e.event, e.data, e.id) for e in events] == [("a", "1", "7"), ("message", "2", "7")]


def test_blank_lines_without_data_dispatch_nothing_and_reset_event_type() -> None:
    assert decode_text("event: a\n\ndata: x\n\n") == [ServerSentEvent("message", "x")]
    assert decode_text("\n\n\n") == []


def test_field_without_colon_and_empty_data() -> None:
    assert decode_text("data\n\n") == [ServerSentEvent("message", "")]
    assert decode_text("data\ndata\n\n") == [ServerSentEvent("message", "\n")]


def test_id_with_nul_is_ignored_and_last_id_persists() -> None:
    events = decode_text("id: a\ndata: 1\n\nid: b\0c\ndata: 2\n\n")
    assert [e.id for e in events] == ["a", "a"]


def test_retry_needs_digits() -> None:
    state, _ = decode_line(SSEState(), "retry: 150")
    assert state.retry == 150
    state, _ = decode_line(state, "retry: 1.5")
    assert state.retry == 150


def test_incomplete_final_event_is_discarded() -> None:
    assert decode_text("data: 1\n\ndata: 2\n") == [ServerSentEvent("message", "1")]


def test_bom_is_stripped() -> None:
    assert decode_text("\ufeffdata: x\n\n") == [ServerSentEvent("message", "x")]


def test_split_lines_holds_back_a_trailing_cr() -> None:
    lines, rest = split_lines("", "a\r")
    assert (lines, rest) == ([], "a\r")
    lines, rest = split_lines(rest, "\nb\n")
    assert (lines, rest) == (["a", "b"], "")


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_chunk_boundaries_do_not_matter(size: int) -> None:
    raw = (FIXTURES / "basic_turn.sse").read_text().replace("\n", "\r\n")
    chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
    assert list(iter_sse(chunks)) == decode_text(raw)
    assert [e.event for e in decode_text(raw)] == [
        "turn_start", "text_delta", "ping", "text_delta", "turn_end"]
