"""Incremental parser of Hermes tool-call markup in streamed model text.

    Checking the weather.\\n<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}
    \\n</tool_call>

becomes `TextDelta("Checking the weather.")`, `ToolCallStart(0, id, "get_weather")`,
`ToolCallDelta(0, '{"city": "Paris"}')` (in as many fragments as the text arrived in),
`ToolCallEnd(0, id, "get_weather", {"city": "Paris"})`.

Contract, whatever way the text is split into `feed` calls:
- the concatenated `TextDelta`s are `text`: the output without the markup, and without the
  whitespace that touches a tag (before `<tool_call>`, after `</tool_call>`);
- the concatenated `ToolCallDelta`s of a call are exactly its arguments' JSON text, and
  `json.loads` of it equals `ToolCallEnd.arguments` (and the `tool_calls` entry);
- a call opened but not closed by the end of the output (max_tokens, a stop string) or whose
  arguments are not a JSON object is dropped: it gets no `ToolCallEnd` and no `tool_calls` entry.
Calls are streamed when their body starts `{"name": ..., "arguments": {` (as the grammar forces);
any other body is buffered to `</tool_call>` and parsed whole (a bad one is kept as text).
Pure: no I/O; ids come from `new_id`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import Any

from engine.constrained.spec import CALL_CLOSE, CALL_OPEN
from gateway.toolcall_events import (
    ParseEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    new_call_id,
)

__all__ = ["ParseEvent", "TextDelta", "ToolCall", "ToolCallDelta", "ToolCallEnd",
           "ToolCallParser", "ToolCallStart", "new_call_id"]


class _Mode(enum.Enum):
    TEXT = "text"
    HEADER = "header"  # after <tool_call>, before the arguments object
    ARGS = "args"  # inside the arguments object, streaming
    TRAILER = "trailer"  # after the arguments object, before </tool_call>
    WHOLE = "whole"  # a body not in the streamable shape: buffered to </tool_call>


class _Scan(enum.Enum):
    MATCH = "match"
    PARTIAL = "partial"
    FAIL = "fail"


class ToolCallParser:
    """Mutable, one per generated turn. `feed` text as it comes, then `finish` once."""

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self._new_id = new_id
        self._mode = _Mode.TEXT
        self._buf = ""
        self._skip_ws = False  # drop whitespace right after </tool_call>
        self._num_started = 0
        self._name = ""
        self._call_id = ""
        self._args: list[str] = []
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self.text = ""
        self.tool_calls: list[ToolCall] = []

    def feed(self, chunk: str) -> list[ParseEvent]:
        """Events completed by `chunk` (possibly none)."""
        self._buf += chunk
        events: list[ParseEvent] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[ParseEvent]:
        """Events of what was held back. Text held in TEXT mode is released (unless it is only
        whitespace after a call); an unfinished call is dropped."""
        events: list[ParseEvent] = []
        if self._mode is _Mode.TEXT:  # (whitespace after a call was already dropped)
            self._emit_text(self._buf, events)
        self._buf = ""
        self._mode = _Mode.TEXT
        return events

    # ---- one step per mode: True when it made progress and may run again -------------------

    def _step(self, events: list[ParseEvent]) -> bool:
        if self._mode is _Mode.TEXT:
            return self._step_text(events)
        if self._mode is _Mode.HEADER:
            return self._step_header(events)
        if self._mode is _Mode.ARGS:
            return self._step_args(events)
        if self._mode is _Mode.TRAILER:
            return self._step_trailer(events)
        return self._step_whole(events)

    def _step_text(self, events: list[ParseEvent]) -> bool:
        if self._skip_ws:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._skip_ws = False
        at = self._buf.find(CALL_OPEN)
        if at >= 0:
            self._emit_text(self._buf[:at].rstrip(), events)
            self._buf = self._buf[at + len(CALL_OPEN):]
            self._mode = _Mode.HEADER
            return True
        # Hold back what may still become "<tool_call>", and trailing whitespace that may
        # turn out to precede one.
        hold = next((k for k in range(min(len(CALL_OPEN) - 1, len(self._buf)), 0, -1)
                     if self._buf.endswith(CALL_OPEN[:k])), 0)
        safe = self._buf[: len(self._buf) - hold]
        kept = safe.rstrip()
        self._emit_text(kept, events)
        self._buf = self._buf[len(kept):]
        return False

    def _step_header(self, events: list[ParseEvent]) -> bool:
        result, name, end = _scan_header(self._buf)
        if result is _Scan.PARTIAL and CALL_CLOSE not in self._buf:
            return False
        if result is not _Scan.MATCH or name is None:
            self._mode = _Mode.WHOLE
            return True
        self._start_call(name, events)
        self._buf = self._buf[end:]
        self._depth, self._in_string, self._escaped = 0, False, False
        self._mode = _Mode.ARGS
        return True

    def _step_args(self, events: list[ParseEvent]) -> bool:
        end = self._scan_args(self._buf)
        piece = self._buf if end is None else self._buf[:end]
        if piece:
            self._args.append(piece)
            events.append(ToolCallDelta(self._num_started - 1, piece))
        self._buf = "" if end is None else self._buf[end:]
        if end is None:
            return False
        self._mode = _Mode.TRAILER
        return True

    def _step_trailer(self, events: list[ParseEvent]) -> bool:
        at = self._buf.find(CALL_CLOSE)
        if at < 0:
            return False
        self._buf = self._buf[at + len(CALL_CLOSE):]
        arguments = _json_object("".join(self._args))
        if arguments is not None:
            self._end_call(arguments, events)
        self._mode, self._skip_ws = _Mode.TEXT, True
        return True

    def _step_whole(self, events: list[ParseEvent]) -> bool:
        at = self._buf.find(CALL_CLOSE)
        if at < 0:
            return False
        body, self._buf = self._buf[:at], self._buf[at + len(CALL_CLOSE):]
        call = _json_object(body)
        name = call.get("name") if call else None
        arguments = call.get("arguments") if call else None
        if isinstance(arguments, str):
            arguments = _json_object(arguments)
        if isinstance(name, str) and isinstance(arguments, dict):
            self._start_call(name, events)
            text = json.dumps(arguments, ensure_ascii=False)
            self._args.append(text)
            events.append(ToolCallDelta(self._num_started - 1, text))
            self._end_call(arguments, events)
        else:
            self._emit_text(CALL_OPEN + body + CALL_CLOSE, events)
        self._mode, self._skip_ws = _Mode.TEXT, True
        return True

    # ---- helpers ---------------------------------------------------------------------------

    def _emit_text(self, text: str, events: list[ParseEvent]) -> None:
        if text:
            self.text += text
            events.append(TextDelta(text))

    def _start_call(self, name: str, events: list[ParseEvent]) -> None:
        self._name, self._call_id, self._args = name, self._new_id(), []
        self._num_started += 1
        events.append(ToolCallStart(self._num_started - 1, self._call_id, name))

    def _end_call(self, arguments: dict[str, Any], events: list[ParseEvent]) -> None:
        self.tool_calls.append(ToolCall(self._call_id, self._name, arguments))
        events.append(ToolCallEnd(self._num_started - 1, self._call_id, self._name, arguments))

    def _scan_args(self, text: str) -> int | None:
        """Index just past the end of the arguments value within `text`, or None if it has not
        ended yet. Carries string/depth state across calls."""
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _scan_header(s: str) -> tuple[_Scan, str | None, int]:
    """Match `s` against `\\s*{\\s*"name"\\s*:\\s*<string>\\s*,\\s*"arguments"\\s*:\\s*` followed
    by `{`: (MATCH, name, index of that `{`), (PARTIAL, None, 0) while `s` is a prefix of such
    text, else (FAIL, None, 0)."""
    i = 0
    name: str | None = None
    for piece in ("{", '"name"', ":", None, ",", '"arguments"', ":"):
        while i < len(s) and s[i].isspace():
            i += 1
        if piece is None:  # the name: a JSON string
            if i == len(s):
                return _Scan.PARTIAL, None, 0
            end = _string_end(s, i)
            if end is None:
                return (_Scan.PARTIAL if s[i] == '"' else _Scan.FAIL), None, 0
            try:
                name = json.loads(s[i:end])
            except ValueError:
                return _Scan.FAIL, None, 0
            i = end
            continue
        got = s[i: i + len(piece)]
        if got != piece[: len(got)]:
            return _Scan.FAIL, None, 0
        if len(got) < len(piece):
            return _Scan.PARTIAL, None, 0
        i += len(piece)
    while i < len(s) and s[i].isspace():
        i += 1
    if i == len(s):
        return _Scan.PARTIAL, None, 0
    return (_Scan.MATCH, name, i) if s[i] == "{" else (_Scan.FAIL, None, 0)


def _string_end(s: str, start: int) -> int | None:
    """Index past the closing quote of the JSON string opening at `s[start]` (a `"`), or None
    if it does not close within `s` (or `s[start]` is not a quote)."""
    if s[start] != '"':
        return None
    i = start + 1
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        if s[i] == '"':
            return i + 1
        i += 1
    return None
