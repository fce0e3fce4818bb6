"""Tools in the prompt, Hermes/Qwen style, for chat templates that know nothing of tools.

ChatML templates (SmolLM2's among them) render `role` and `content` only, so tool use is written
into the messages themselves before the template sees them, as Qwen2.5's template writes it:

    system     the session's system text, then "# Tools" with one JSON line per tool inside
               <tools></tools>, and how to call one: <tool_call>{"name", "arguments"}</tool_call>
    assistant  its content, then each call as `engine.constrained.spec.render_call` writes it,
               newline-separated (the markup the grammar forces when the model generates one)
    tool       the result inside <tool_response></tool_response>, as role "tool" (Hermes) where
               the template renders that role, else as "user"

Every transformation is per message, so per-turn (delta) rendering stays prefix-stable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from engine.constrained.spec import ToolChoiceMode, ToolConstraint, ToolSchema, render_call
from gateway.errors import InvalidRequest, InvalidToolSchema

_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n"
               "<tools>")
_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and "
               "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
               '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


@dataclass(frozen=True)
class ToolDef:
    """One declared tool, whatever shape it was given in. `parameters`: an object schema."""

    name: str
    description: str | None
    parameters: dict[str, Any]

    def openai_shape(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


def normalize_tools(tools: Sequence[Mapping[str, Any]]) -> list[ToolDef]:
    """Tools in OpenAI (`{"type": "function", "function": {...}}`) or Anthropic (`{"name",
    "input_schema"}`) shape. Raises `InvalidToolSchema` for a schema that is not a valid JSON
    schema of an object, and for duplicate names."""
    defs: list[ToolDef] = []
    for tool in tools:
        spec = tool.get("function", tool)
        name = str(spec.get("name", ""))
        params = spec.get("parameters", spec.get("input_schema"))
        params = {"type": "object"} if params is None else params
        if not isinstance(params, Mapping):
            raise InvalidToolSchema(f"tool {name!r}: the parameters schema must be an object")
        params = dict(params)
        if params.get("type", "object") != "object":
            raise InvalidToolSchema(f"tool {name!r}: the parameters schema must describe an "
                                    f"object, not {params.get('type')!r}")
        try:
            validator_for(params).check_schema(params)
        except SchemaError as exc:
            where = "/".join(str(p) for p in exc.path) or "(root)"
            raise InvalidToolSchema(f"tool {name!r}: invalid JSON schema at {where}: "
                                    f"{exc.message}") from exc
        description = spec.get("description")
        defs.append(ToolDef(name, str(description) if description else None, params))
    names = [d.name for d in defs]
    if len(set(names)) != len(names):
        raise InvalidToolSchema("tool names must be unique")
    return defs


def tools_system_content(system: str | None, tools: Sequence[ToolDef]) -> str:
    """The system message's content: `system`, then the tools block."""
    lines = "".join("\n" + json.dumps(t.openai_shape(), ensure_ascii=False) for t in tools)
    head = f"{system}\n\n" if system else ""
    return head + _TOOLS_HEAD + lines + _TOOLS_TAIL


def template_messages(messages: Sequence[Mapping[str, Any]], *,
                      tool_role: str = "tool") -> list[dict[str, Any]]:
    """Messages with tool calls and tool results written as text (see the module docstring).
    Other messages pass through. Raises `InvalidRequest` for a malformed tool call."""
    out: list[dict[str, Any]] = []
    for message in messages:
        msg = dict(message)
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            calls = [render_call(*_call_parts(c)) for c in msg.pop("tool_calls")]
            text = _text(msg.get("content"))
            msg["content"] = "\n".join([text, *calls] if text else calls)
        elif msg.get("role") == "tool":
            msg.pop("tool_call_id", None)
            msg.update(role=tool_role,
                       content=f"<tool_response>\n{_text(msg.get('content'))}\n</tool_response>")
        out.append(msg)
    return out


def tool_constraint(tools: Sequence[ToolDef], choice: str | Mapping[str, Any] | None, *,
                    enable_parallel_calls: bool = True,
                    text_schema: str | None = None) -> ToolConstraint | None:
    """The engine constraint for `generate.tool_choice` (default "auto") and the structured
    output's `text_schema` (`gateway.response_format.text_schema`), which "required" and named
    choices leave out (they produce calls only); None without tools under "auto"/"none" and
    without a schema. Raises `InvalidRequest` for a choice the tools cannot satisfy."""
    if not tools:
        if choice is None or choice in ("auto", "none"):
            return None if text_schema is None else ToolConstraint((), "none",
                                                                   text_schema=text_schema)
        raise InvalidRequest("generate.tool_choice needs tools, and the session has none")
    specs = tuple(ToolSchema(t.name, json.dumps(t.parameters, ensure_ascii=False))
                  for t in tools)
    if choice is None or isinstance(choice, str):
        mode = cast(ToolChoiceMode, choice or "auto")
        return ToolConstraint(specs, mode, enable_parallel_calls=enable_parallel_calls,
                              text_schema=text_schema if mode in ("auto", "none") else None)
    name = str(choice.get("name", ""))
    if name not in {t.name for t in tools}:
        raise InvalidRequest(f"generate.tool_choice names an undeclared tool {name!r}")
    return ToolConstraint(specs, "named", name)


def _call_parts(call: Any) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of a stored (`{id, name, arguments}`) or OpenAI-shaped call."""
    if not isinstance(call, Mapping):
        raise InvalidRequest("a tool call must be an object")
    spec = call.get("function", call)
    name, arguments = spec.get("name"), spec.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise InvalidRequest(f"tool call {name!r}: arguments are not JSON") from exc
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise InvalidRequest("a tool call needs a string name and an object of arguments")
    return name, arguments


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content
                   if isinstance(b, str) or (isinstance(b, Mapping) and b.get("type") == "text"))
