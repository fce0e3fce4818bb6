"""Tool schemas from signatures and docstrings, and running tool calls into result messages."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Optional

import pytest

from sdk._docstrings import parse_docstring
from sdk.tools import (
    Tool,
    ToolCall,
    ToolResult,
    arun_tool,
    format_output,
    function_schema,
    parse_tool_call,
    run_tool,
    tool,
    tool_message,
    type_schema,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@pytest.mark.parametrize(("annotation", "expected"), [
    (str, {"type": "string"}),
    (int, {"type": "integer"}),
    (float, {"type": "number"}),
    (bool, {"type": "boolean"}),
    (None, {"type": "null"}),
    (Any, {}),
    (list[str], {"type": "array", "items": {"type": "string"}}),
    (list, {"type": "array"}),
    (Sequence[int], {"type": "array", "items": {"type": "integer"}}),
    (set[float], {"type": "array", "items": {"type": "number"}}),
    (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
    (list[list[bool]], {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}}),
    (dict, {"type": "object"}),
    (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
    (Mapping[str, list[str]],
     {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}}),
    (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
    (Literal[1, 2], {"type": "integer", "enum": [1, 2]}),
    (Literal["a", 1], {"enum": ["a", 1]}),
    (Color, {"type": "string", "enum": ["red", "blue"]}),
    (Level, {"type": "integer", "enum": [1, 2]}),
    (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),  # noqa: UP045
    (int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
    (Annotated[str, "a path"], {"type": "string", "description": "a path"}),
])
def test_type_schema(annotation: Any, expected: dict[str, Any]) -> None:
    assert type_schema(annotation) == expected


@pytest.mark.parametrize("annotation", [tuple[int, str], dict[int, str], complex, object, bytes])
def test_type_schema_rejects_unsupported(annotation: Any) -> None:
    with pytest.raises(TypeError):
        type_schema(annotation)


def edit_file(path: str, mode: Literal["replace", "append"], lines: list[int],
              color: Color = Color.RED, note: str | None = None, *, dry_run: bool = False,
              limit: Optional[int] = 10) -> str:  # noqa: UP045
    """Edit one file of the
    workspace.

    Everything after the first paragraph stays out of the description.

    Args:
        path (str): File to edit,
            relative to the root.
        mode: How to write.
        lines: Line numbers.
        dry_run: Only report.
        unknown: Not a parameter; ignored.

    Returns:
        A summary.
    """
    return f"{path}:{mode}:{lines}:{color.value}:{note}:{dry_run}:{limit}"


def test_function_schema_from_signature_and_docstring() -> None:
    description, parameters = function_schema(edit_file)
    assert description == "Edit one file of the workspace."
    assert parameters == {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to edit, relative to the root."},
            "mode": {"type": "string", "enum": ["replace", "append"],
                     "description": "How to write."},
            "lines": {"type": "array", "items": {"type": "integer"},
                      "description": "Line numbers."},
            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
            "note": {"type": "string"},  # `X | None = None`: omitted means None
            "dry_run": {"type": "boolean", "description": "Only report.", "default": False},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": 10},
        },
        "required": ["path", "mode", "lines"],
        "additionalProperties": False,
    }


def test_tool_builds_the_openai_declaration() -> None:
    built = tool(edit_file)
    assert built.name == "edit_file" and not built.is_async
    declared = built.to_openai()
    assert declared["type"] == "function"
    assert declared["function"] == {"name": "edit_file", "description": built.description,
                                    "parameters": built.parameters}
    renamed = tool(name="edit", description="Edit.")(edit_file)
    assert (renamed.name, renamed.description) == ("edit", "Edit.")


@pytest.mark.parametrize("bad", [
    lambda *paths: None,
    lambda **options: None,
    lambda x, /: None,
])
def test_tool_rejects_unnamed_parameters(bad: Any) -> None:
    with pytest.raises(TypeError):
        tool(bad)


def test_tool_name_must_be_a_valid_function_name() -> None:
    with pytest.raises(ValueError):
        Tool("no spaces", "", {"type": "object"}, edit_file)


@pytest.mark.parametrize(("doc", "expected"), [
    (None, ("", {})),
    ("", ("", {})),
    ("One line.", ("One line.", {})),
    ("Args:\n    x: The x.", ("", {"x": "The x."})),
    ("Sum.\n\nArguments:\n  a (int): first\n  b: second\n    continued\nRaises:\n  ValueError",
     ("Sum.", {"a": "first", "b": "second continued"})),
    ("Sum.\nArgs:\n    a: first\n\n    b: second\n\nMore prose.", ("Sum.", {"a": "first",
                                                                          "b": "second"})),
])
def test_parse_docstring(doc: str | None, expected: tuple[str, dict[str, str]]) -> None:
    assert parse_docstring(doc) == expected


# ---- running calls -----------------------------------------------------------------------------


def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


def shout(text: str) -> dict[str, Any]:
    """Upper-case."""
    return {"text": text.upper(), "n": len(text)}


async def slow_echo(text: str) -> str:
    """Echo after a pause."""
    await asyncio.sleep(0)
    return text


TOOLS = {t.name: t for t in (tool(divide), tool(shout), tool(edit_file), tool(slow_echo))}


@pytest.mark.parametrize(("call", "content", "is_error"), [
    (ToolCall("c1", "divide", {"a": 1, "b": 4}), "0.25", False),
    (ToolCall("c2", "shout", {"text": "hé"}), '{"text": "HÉ", "n": 2}', False),
    (ToolCall("c3", "edit_file", {"path": "a.py", "mode": "append", "lines": ["3"],
                                  "color": "blue"}),
     "a.py:append:[3]:blue:None:False:10", False),  # coerced: "3" → 3, "blue" → Color.BLUE
    (ToolCall("c4", "divide", {"a": 1, "b": 0}),
     "Error: divide raised ZeroDivisionError: float division by zero", True),
    (ToolCall("c5", "divide", {"a": 1}),
     "Error: invalid arguments for divide: b: Missing required argument", True),
    (ToolCall("c6", "edit_file", {"path": "a", "mode": "delete", "lines": [], "x": 1}),
     "Error: invalid arguments for edit_file: mode: Input should be 'replace' or 'append'; "
     "x: Unexpected keyword argument", True),
    (ToolCall("c7", "rm_rf", {}),
     "Error: unknown tool 'rm_rf'; the available tools are: divide, edit_file, shout, "
     "slow_echo", True),
])
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_run_tool(call: ToolCall, content: str, is_error: bool, sync: bool) -> None:
    ticks = iter([10.0, 10.5])
    clock = lambda: next(ticks)  # noqa: E731
    result = run_tool(TOOLS, call, clock) if sync else asyncio.run(arun_tool(TOOLS, call, clock))
    assert result.call == call
    assert (result.content, result.is_error) == (content, is_error)
    if call.name in TOOLS:
        assert result.duration_s == 0.5


def test_async_tool_is_awaited() -> None:
    result = asyncio.run(arun_tool(TOOLS, ToolCall("c", "slow_echo", {"text": "hi"})))
    assert (result.content, result.is_error) == ("hi", False)


@pytest.mark.parametrize(("value", "text"), [
    ("plain", "plain"), (None, ""), (3, "3"), ([1, "a"], '[1, "a"]'), ({"k": {1, 2}}, None),
])
def test_format_output(value: Any, text: str | None) -> None:
    out = format_output(value)
    assert out == text if text is not None else out.startswith('{"k": "{')


@pytest.mark.parametrize(("raw", "expected"), [
    ({"id": "c1", "name": "f", "arguments": {"x": 1}}, ToolCall("c1", "f", {"x": 1})),
    ({"id": "c1", "name": "f", "arguments": '{"x": 1}'}, ToolCall("c1", "f", {"x": 1})),
    ({"id": "c1", "name": "f", "arguments": "{oops"}, ToolCall("c1", "f",
                                                               {"__unparsed__": "{oops"})),
    ({"id": "c1", "name": "f", "arguments": [1]}, ToolCall("c1", "f", {"__unparsed__": [1]})),
    ({"id": "c1", "name": "f"}, ToolCall("c1", "f", {})),
])
def test_parse_tool_call(raw: dict[str, Any], expected: ToolCall) -> None:
    assert parse_tool_call(raw) == expected


def test_unparsed_arguments_fail_validation_with_a_readable_error() -> None:
    result = run_tool(TOOLS, parse_tool_call({"id": "c", "name": "shout", "arguments": "{x"}))
    assert result.is_error and result.content.startswith("Error: invalid arguments for shout")


def test_tool_message() -> None:
    result = ToolResult(ToolCall("call_7", "divide", {}), "0.5")
    assert tool_message(result) == {"role": "tool", "tool_call_id": "call_7", "content": "0.5"}
