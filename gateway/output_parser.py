"""Which parser a turn's output goes through, given its engine constraint.

    no constraint, or tool choice "none"     none: the output is text (JSON text included)
    "auto" with a text schema                `AnswerOrCallsParser`: one JSON value or calls only
    otherwise                                `ToolCallParser`
"""

from __future__ import annotations

from collections.abc import Callable

from engine.constrained.spec import CALL_OPEN, ToolConstraint
from gateway.toolcall_parser import ParseEvent, TextDelta, ToolCallParser, new_call_id


class AnswerOrCallsParser(ToolCallParser):
    """The output of "auto" with a text schema: the grammar makes it either one JSON value or
    calls from the first character on, so that character decides. `<` opens calls, parsed as
    `ToolCallParser` parses them; anything else is the JSON answer, passed through verbatim as
    text even where a string inside it spells `<tool_call>`."""

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        super().__init__(new_id)
        self._is_answer: bool | None = None  # undecided until the first character

    def feed(self, chunk: str) -> list[ParseEvent]:
        if self._is_answer is None and chunk:
            self._is_answer = not chunk.startswith(CALL_OPEN[0])
        if not self._is_answer:
            return super().feed(chunk)
        self.text += chunk
        return [TextDelta(chunk)]


def parser_for(constraint: ToolConstraint | None) -> ToolCallParser | None:
    """A fresh parser for one turn's output under `constraint` (see the module docstring)."""
    if constraint is None or constraint.mode == "none":
        return None
    if constraint.mode == "auto" and constraint.text_schema is not None:
        return AnswerOrCallsParser()
    return ToolCallParser()
