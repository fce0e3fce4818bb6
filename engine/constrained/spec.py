"""What a constrained request asks for, as plain data (no torch, no xgrammar).

Tool calls use the Hermes/Qwen markup that ChatML models are prompted with:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`call_prefix(name)` and `CALL_SUFFIX` are that markup around the arguments object, exactly as the
grammar forces it and as the gateway renders earlier calls back into the prompt.

Structured output: a constraint's `text_schema` is the JSON schema the output's text must match
(a JSON object for OpenAI's `json_object`); the text is then one JSON value and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from engine.errors import InvalidRequest, InvalidToolSchema

CALL_OPEN: Final[str] = "<tool_call>"
CALL_CLOSE: Final[str] = "</tool_call>"
CALL_SUFFIX: Final[str] = "}\n" + CALL_CLOSE
CALL_SEPARATOR: Final[str] = "\n"  # between consecutive calls

ToolChoiceMode = Literal["auto", "required", "none", "named"]
_MODES: Final[frozenset[str]] = frozenset(get_args(ToolChoiceMode))


def call_prefix(name: str) -> str:
    """Markup from the opening tag up to the arguments object of a call to `name`."""
    return f'{CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '


def render_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One whole call in the markup the grammar produces (arguments as compact-spaced JSON)."""
    return call_prefix(name) + json.dumps(dict(arguments), ensure_ascii=False) + CALL_SUFFIX


@dataclass(frozen=True)
class ToolSchema:
    """One declared tool: its name and the JSON schema (as JSON text) of its arguments object."""

    name: str
    parameters: str

    @property
    def parameters_schema(self) -> dict[str, Any]:
        """Raises `InvalidToolSchema` unless `parameters` is the JSON text of an object."""
        try:
            value = json.loads(self.parameters)
        except ValueError as exc:
            raise InvalidToolSchema(f"tool {self.name!r}: parameters are not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise InvalidToolSchema(f"tool {self.name!r}: parameters must be a JSON object schema")
        return value


@dataclass(frozen=True)
class ToolConstraint:
    """Which tool calls the output may (or must) contain.

    mode "auto": free text, and once `<tool_call>` opens, a call to one of `tools` whose arguments
    match its schema, then free text again (several calls allowed). "required": one or more calls
    from the first token on, separated by newlines, then the end. "named": exactly one call to
    `name`, then the end. "none": free text that never contains `<tool_call>`. Without
    `enable_parallel_calls`, "auto" and "required" end right after the first call.

    With `text_schema` (the JSON text of a JSON schema), free text becomes one JSON value
    matching it: "none" (or no tools) is exactly that value, then the end; "auto" is either that
    value or one or more calls as under "required" (never both, no text around them). "required"
    and "named" produce calls only, so they take no `text_schema`.
    Hashable (the grammar cache key). Raises `InvalidRequest` on an inconsistent choice.
    """

    tools: tuple[ToolSchema, ...]
    mode: ToolChoiceMode = "auto"
    name: str | None = None  # the tool of mode "named"
    enable_parallel_calls: bool = True
    text_schema: str | None = None  # JSON text of the schema the text must match

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise InvalidRequest(f"unknown tool choice mode {self.mode!r}")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise InvalidRequest("tool names must be unique")
        if self.mode in ("required", "named") and not self.tools:
            raise InvalidRequest(f"tool choice {self.mode!r} needs at least one tool")
        if (self.mode == "named") != (self.name is not None):
            raise InvalidRequest("a tool name is given exactly with tool choice 'named'")
        if self.name is not None and self.name not in names:
            raise InvalidRequest(f"tool choice names an undeclared tool {self.name!r}")
        if self.text_schema is not None:
            if self.mode in ("required", "named"):
                raise InvalidRequest(f"tool choice {self.mode!r} produces calls only and takes "
                                     "no text schema")
            _schema_value(self.text_schema)

    @property
    def text_schema_value(self) -> dict[str, Any] | bool | None:
        """`text_schema` parsed (an object or a boolean schema); None without one."""
        return None if self.text_schema is None else _schema_value(self.text_schema)

    @property
    def chosen_tools(self) -> tuple[ToolSchema, ...]:
        """The tools a call may name under this choice."""
        if self.mode == "named":
            return tuple(t for t in self.tools if t.name == self.name)
        return self.tools if self.mode != "none" else ()

    def to_dict(self) -> dict[str, Any]:
        return {"tools": [[t.name, t.parameters] for t in self.tools], "mode": self.mode,
                "name": self.name, "enable_parallel_calls": self.enable_parallel_calls,
                "text_schema": self.text_schema}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolConstraint:
        """Inverse of `to_dict`. Raises `InvalidRequest` on a malformed body."""
        try:
            tools = tuple(ToolSchema(str(name), str(params)) for name, params in data["tools"])
            schema = data.get("text_schema")
            return cls(tools, data["mode"], data.get("name"),
                       bool(data.get("enable_parallel_calls", True)),
                       None if schema is None else str(schema))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"malformed tool constraint: {exc}") from exc


def _schema_value(text: str) -> dict[str, Any] | bool:
    """A schema's JSON text parsed. Raises `InvalidRequest` unless it is an object or a boolean."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"the text schema is not JSON: {exc}") from exc
    if not isinstance(value, dict | bool):
        raise InvalidRequest("the text schema must be a JSON object (or a boolean)")
    return value
