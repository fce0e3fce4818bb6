"""The events of a streamed assistant turn's tool calls, as `toolcall_parser` emits them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    arguments: str  # a fragment of the arguments' JSON text


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    id: str
    name: str
    arguments: dict[str, Any]


ParseEvent = TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
