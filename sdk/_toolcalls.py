"""Tool-call accumulation from stream events, as pure functions (both stream twins use them).

A call's `tool_call_delta` fragments are appended as text and re-parsed with a partial-JSON parser
on each delta (pydantic-core's `from_json` with `allow_partial="trailing-strings"`), never merged
as half-parsed objects. `tool_call_end` carries the server's parsed arguments, which win.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_core import from_json

from sdk.types import ToolCallDelta, ToolCallEnd, ToolCallStart


@dataclass(frozen=True)
class ToolCallSnapshot:
    """One call as streamed so far. `arguments_json` is the concatenated fragments;
    `arguments` its (partial) parse; `is_done` once `tool_call_end` arrived."""

    index: int
    id: str
    name: str
    arguments_json: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    is_done: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The turn's `tool_calls` entry: `{"id", "name", "arguments"}`."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


def partial_arguments(text: str) -> dict[str, Any]:
    """The object that a prefix of JSON text shows so far ({} while nothing parses)."""
    if not text.strip():
        return {}
    try:
        value = from_json(text, allow_partial="trailing-strings")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def accumulate_tool_call(calls: tuple[ToolCallSnapshot, ...],
                         event: ToolCallStart | ToolCallDelta | ToolCallEnd
                         ) -> tuple[ToolCallSnapshot, ...]:
    """The calls after `event`. Pure. Events for an index never started are ignored."""
    if isinstance(event, ToolCallStart):
        return (*calls, ToolCallSnapshot(event.index, event.id, event.name))
    out = list(calls)
    for i, call in enumerate(out):
        if call.index != event.index:
            continue
        if isinstance(event, ToolCallDelta):
            text = call.arguments_json + event.arguments
            out[i] = replace(call, arguments_json=text, arguments=partial_arguments(text))
        else:
            out[i] = replace(call, arguments=dict(event.arguments), is_done=True)
    return tuple(out)
