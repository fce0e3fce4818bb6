"""Tools for `AgentLoop`: Python callables described by JSON schemas taken from their signatures
and docstrings, and the pure rules for turning a tool call into a tool-result message.

Supported parameter annotations: `str`, `int`, `float`, `bool`, `None`, `Any` (or none at all),
`list[X]` / `set[X]` / `tuple[X, ...]` / `Sequence[X]`, `dict[str, X]` / `Mapping[str, X]`,
`Literal[...]`, `Enum` subclasses, unions and `X | None`, and `Annotated[X, "description"]`.
A parameter with a default is optional; `X | None = None` is described as plain `X`.
The docstring's first paragraph is the tool's description; a Google-style `Args:` section gives
the parameters' descriptions. Anything else raises `TypeError` when the tool is built.
"""

from __future__ import annotations

import asyncio
import collections.abc
import enum
import functools
import inspect
import json
import re
import time
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError, validate_call

from sdk._docstrings import parse_docstring

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
    bool: {"type": "boolean"}, type(None): {"type": "null"}, None: {"type": "null"},
}
_ARRAYS = (list, set, frozenset, collections.abc.Sequence, collections.abc.Set,
           collections.abc.Iterable)
_OBJECTS = (dict, collections.abc.Mapping)


@dataclass(frozen=True)
class Tool:
    """A callable the model may call. `parameters` is a JSON schema of type object; `fn` is
    called with the decoded arguments as keyword arguments (validated and coerced by pydantic,
    so an enum parameter receives the enum member)."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]

    def __post_init__(self) -> None:
        if not _NAME_RE.fullmatch(self.name):
            raise ValueError(f"tool name {self.name!r} must be 1-64 of [A-Za-z0-9_-]")

    @functools.cached_property
    def _validated(self) -> Callable[..., Any]:
        return validate_call(self.fn)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI-shape declaration `CreateSessionRequest.tools` accepts."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}

    def bind(self, arguments: Mapping[str, Any]) -> Callable[[], Any]:
        """A zero-argument call of the tool with `arguments` (validated when called)."""
        validated = self._validated
        return lambda: validated(**arguments)


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         description: str | None = None) -> Any:
    """`tool(fn)` or the decorator `@tool(name=...)`: a `Tool` built from `fn`'s signature and
    docstring (`name` defaults to `fn.__name__`, `description` to the docstring's first
    paragraph). Raises TypeError for an unsupported signature."""
    def build(f: Callable[..., Any]) -> Tool:
        doc_description, parameters = function_schema(f)
        return Tool(name or f.__name__, description or doc_description, parameters, f)

    return build if fn is None else build(fn)


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    return obj if isinstance(obj, Tool) else tool(obj)


def function_schema(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """(description, parameters schema) of `fn`. Raises TypeError for `*args`, `**kwargs`,
    positional-only parameters and unsupported annotations."""
    description, param_docs = parse_docstring(inspect.getdoc(fn))
    hints = typing.get_type_hints(fn, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"{fn.__name__}: tool parameters must be named ({param})")
        annotation = hints.get(param.name, Any)
        if param.default is None:
            annotation = _drop_none(annotation)
        try:
            schema = type_schema(annotation)
        except TypeError as exc:
            raise TypeError(f"{fn.__name__}({param.name}): {exc}") from None
        if param.name in param_docs:
            schema = {**schema, "description": param_docs[param.name]}
        if param.default is param.empty:
            required.append(param.name)
        elif _is_json_value(param.default) and param.default is not None:
            schema = {**schema, "default": _json_value(param.default)}
        properties[param.name] = schema
    return description, {"type": "object", "properties": properties, "required": required,
                         "additionalProperties": False}


def type_schema(annotation: Any) -> dict[str, Any]:
    """JSON schema of one annotation. Pure. Raises TypeError if it is not supported."""
    if annotation is Any or annotation is inspect.Parameter.empty:
        return {}
    if annotation in _SCALARS:
        return dict(_SCALARS[annotation])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum_schema([member.value for member in annotation])
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = type_schema(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        return {**schema, "description": notes[0]} if notes else schema
    if origin is typing.Literal:
        return _enum_schema([_json_value(a) for a in args])
    if origin is typing.Union or origin is types.UnionType:
        return {"anyOf": [type_schema(a) for a in args]}
    if annotation in _ARRAYS or annotation is tuple:
        return {"type": "array"}
    if annotation in _OBJECTS:
        return {"type": "object"}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": type_schema(args[0])}
        raise TypeError(f"only tuple[X, ...] is supported, not {annotation}")
    if origin in _ARRAYS:
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if origin in _OBJECTS:
        if args and args[0] is not str:
            raise TypeError(f"object keys must be str, not {args[0]}")
        return ({"type": "object", "additionalProperties": type_schema(args[1])} if args
                else {"type": "object"})
    raise TypeError(f"unsupported tool parameter type {annotation!r}")


def _drop_none(annotation: Any) -> Any:
    """`X | None` → `X` (for a parameter defaulting to None: omitted means None)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
        return typing.Union[tuple(rest)]  # noqa: UP007 - built from a runtime tuple
    return annotation


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    for kind, name in ((bool, "boolean"), (str, "string"), (int, "integer")):
        if values and all(type(v) is kind for v in values):
            return {"type": name, "enum": values}
    return {"enum": values}


def _json_value(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _is_json_value(value: Any) -> bool:
    try:
        json.dumps(_json_value(value))
    except (TypeError, ValueError):
        return False
    return True


# ---- calls and results -------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: the turn's `tool_calls` entry."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What running one call gave: `content` is sent to the model as the tool message."""

    call: ToolCall
    content: str
    is_error: bool = False
    duration_s: float = 0.0


def parse_tool_call(raw: Any) -> ToolCall:
    """A `ToolCall` from a turn's entry: a dict (or model) with `id`, `name` and `arguments`
    (an object, or a JSON text of one; anything else becomes `{}` and fails validation)."""
    data = raw if isinstance(raw, Mapping) else getattr(raw, "__dict__", {})
    arguments = data.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {"__unparsed__": arguments}
    if not isinstance(arguments, dict):
        arguments = {"__unparsed__": arguments}
    return ToolCall(str(data.get("id") or ""), str(data.get("name") or ""), arguments)


def resolve_call(tools: Mapping[str, Tool], call: ToolCall) -> Tool | str:
    """The tool `call` names, or the error text to send back for an unknown one."""
    found = tools.get(call.name)
    if found is None:
        known = ", ".join(sorted(tools)) or "none"
        return f"Error: unknown tool {call.name!r}; the available tools are: {known}"
    return found


def run_tool(tools: Mapping[str, Tool], call: ToolCall,
             clock: Callable[[], float] = time.perf_counter) -> ToolResult:
    """Run one call. Never raises for the tool's sake: an unknown name, invalid arguments or an
    exception inside the tool become an error result (`is_error`) the model can read."""
    found = resolve_call(tools, call)
    if isinstance(found, str):
        return ToolResult(call, found, is_error=True)
    start = clock()
    try:
        value = found.bind(call.arguments)()
    except Exception as exc:  # noqa: BLE001 - the model gets the error as the tool's answer
        return ToolResult(call, format_error(call, exc), True, clock() - start)
    return ToolResult(call, format_output(value), False, clock() - start)


async def arun_tool(tools: Mapping[str, Tool], call: ToolCall,
                    clock: Callable[[], float] = time.perf_counter) -> ToolResult:
    """Async twin of `run_tool`: coroutine tools are awaited, plain ones run in a worker thread
    (`asyncio.to_thread`, which carries the tracing context) so the event loop keeps going."""
    found = resolve_call(tools, call)
    if isinstance(found, str):
        return ToolResult(call, found, is_error=True)
    start = clock()
    bound = found.bind(call.arguments)
    try:
        value = await bound() if found.is_async else await asyncio.to_thread(bound)
    except Exception as exc:  # noqa: BLE001 - the model gets the error as the tool's answer
        return ToolResult(call, format_error(call, exc), True, clock() - start)
    return ToolResult(call, format_output(value), False, clock() - start)


def format_output(value: Any) -> str:
    """A tool's return value as message text: strings as they are, None as "", anything else
    as JSON (non-JSON values through `str`)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, default=str, ensure_ascii=False)


def format_error(call: ToolCall, exc: BaseException) -> str:
    """The error text the model sees when its call fails. Pure."""
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        return f"Error: invalid arguments for {call.name}: {problems}"
    return f"Error: {call.name} raised {type(exc).__name__}: {exc}"


def tool_message(result: ToolResult) -> dict[str, Any]:
    """`{"role": "tool", "tool_call_id": ..., "content": ...}` for the next append."""
    return {"role": "tool", "tool_call_id": result.call.id, "content": result.content}
