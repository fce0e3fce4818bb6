"""Normalized tool sets, remembered: a session's tools are checked once, not on every turn."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from engine.constrained.spec import ToolConstraint
from gateway.response_format import text_schema
from gateway.schemas import GenerateOptions, NamedToolChoice
from gateway.tool_prompt import ToolDef, normalize_tools, tool_constraint

MAX_CACHED_TOOLSETS = 64


class Toolsets:
    """An LRU of `normalize_tools` results, keyed by the tools' canonical JSON."""

    def __init__(self, max_size: int = MAX_CACHED_TOOLSETS) -> None:
        self.max_size = max_size
        self._known: OrderedDict[str, list[ToolDef]] = OrderedDict()

    def of(self, tools: Sequence[Mapping[str, Any]]) -> list[ToolDef]:
        """`normalize_tools(tools)`. Raises InvalidToolSchema."""
        key = json.dumps(tools, sort_keys=True, default=str)
        cached = self._known.get(key)
        if cached is None:
            cached = self._known[key] = normalize_tools(tools)
            if len(self._known) > self.max_size:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(key)
        return cached

    def for_turn(self, tools: Sequence[Mapping[str, Any]], options: GenerateOptions,
                 response_format: Mapping[str, Any] | None = None
                 ) -> tuple[list[ToolDef], ToolConstraint | None]:
        """The tools and the grammar of `options.tool_choice` and `response_format` (normalized:
        `gateway.response_format.normalize_response_format`). Raises InvalidToolSchema and
        InvalidRequest (a choice the tools cannot satisfy)."""
        defs = self.of(tools)
        choice = options.tool_choice
        if isinstance(choice, NamedToolChoice):
            return defs, tool_constraint(defs, {"name": choice.name})
        return defs, tool_constraint(defs, choice,
                                     enable_parallel_calls=options.parallel_tool_calls,
                                     text_schema=text_schema(response_format))
