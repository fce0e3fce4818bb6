"""Responses API items ↔ native messages, and the output items of a generated turn.

Input items (each a dict; `id` and `status` optional, as Codex replays them):

    message                    role user / assistant / system / developer; content a string or
                               input_text / output_text parts → a native message
    function_call              {call_id, name, arguments (JSON text)} → a call of the assistant
                               message before it (a new one if the previous item is not the
                               assistant's), as one reply with text and calls is replayed
    custom_tool_call           {call_id, name, input} → a call with arguments {"input": input};
                               a call with `status: incomplete` (cut off by the output limit,
                               then replayed) gets arguments {} when its text does not parse
    function_call_output,
    custom_tool_call_output    {call_id, output} → a native tool message (Codex sends some
                               results by `name` alone: a tool message with no call id)
    reasoning                  kept verbatim in the stored input (encrypted_content included);
                               nothing reaches the prompt: the served model does not reason
    item_reference             {id}: the item of that id, resolved by the caller before mapping

Developer messages are system messages. Tools: flat function tools as they are; a custom tool
(Codex's freeform `apply_patch`) is a function of one string argument `input`, and a call to it
comes back as a `custom_tool_call`. Hosted tools (web search, file search, ...) are accepted and
not offered to the model: nothing here can run them.

Item ids: output items are `<kind>_<rid>_<n>` with `rid` the response id's body, so an id names
its response (`item_reference`, `input_items`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gateway.compat.conversation import ToolChoice, function_tool
from gateway.errors import InvalidRequest

RESPONSE_PREFIX: Final[str] = "resp_"
_KIND_PREFIX: Final[Mapping[str, str]] = {
    "message": "msg", "function_call": "fc", "custom_tool_call": "ctc",
    "function_call_output": "fco", "custom_tool_call_output": "ctco", "reasoning": "rs",
    "item_reference": "ref"}
_TEXT_PARTS: Final = frozenset({"input_text", "output_text", "text", "summary_text",
                                "reasoning_text"})
_ROLES: Final = frozenset({"user", "assistant", "system", "developer"})
CUSTOM_INPUT_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
    "additionalProperties": False}


def item_id(kind: str, response_id: str, n: int | str) -> str:
    """Id of item `n` of a response (`o3` output, `i3` input) of type `kind`."""
    return f"{kind_prefix(kind)}_{response_id.removeprefix(RESPONSE_PREFIX)}_{n}"


def kind_prefix(kind: str) -> str:
    """The id prefix of an item of type `kind` (`msg`, `fc`, ...; `item` for others)."""
    return _KIND_PREFIX.get(kind, "item")


def response_of_item(item_id_: str) -> str | None:
    """The response id an item id of ours names, or None for a foreign id."""
    head, _, rest = item_id_.partition("_")
    body, _, n = rest.rpartition("_")
    if head not in _KIND_PREFIX.values() and head != "item" or not body or not n:
        return None
    return RESPONSE_PREFIX + body


def normalize_input(raw: str | Sequence[Any], *, where: str = "input") -> list[dict[str, Any]]:
    """The input as a list of item dicts (a string is one user message). Raises InvalidRequest
    for an item that is not an object or has an unknown type, naming `param`."""
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    items: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        param = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"{param}: an item must be an object", param=param)
        kind = item.get("type", "message" if "role" in item else None)
        if kind not in _KIND_PREFIX:
            raise InvalidRequest(f"{param}.type: unsupported item type {kind!r} (supported: "
                                 f"{', '.join(sorted(_KIND_PREFIX))})", param=f"{param}.type")
        items.append({**item, "type": kind})
    return items


def native_messages(items: Sequence[Mapping[str, Any]], *, where: str = "input",
                    offset: int = 0) -> list[dict[str, Any]]:
    """Native messages of resolved items (no `item_reference` left). `offset`: index of
    items[0] in the request, for `param`. Raises InvalidRequest naming the faulty `param`."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"{where}[{i + offset}]"
        kind = item["type"]
        if kind == "message":
            out.append(_message(item, param))
        elif kind in ("function_call", "custom_tool_call"):
            call = _call(item, param)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            text = _text(item.get("output"), f"{param}.output")
            call_id = item.get("call_id")
            if call_id is None and isinstance(item.get("name"), str):
                # Codex reports some of its own tools' results by name, with no call_id.
                out.append({"role": "tool", "content": text})
            else:
                out.append({"role": "tool", "content": text,
                            "tool_call_id": _required_str(item, "call_id", param)})
        elif kind == "item_reference":
            raise InvalidRequest(f"{param}: unresolved item_reference", param=param)
        # reasoning: nothing reaches the prompt
    return out


def _message(item: Mapping[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidRequest(f"{param}.role: must be one of user, assistant, system, developer",
                             param=f"{param}.role")
    text = _text(item.get("content"), f"{param}.content")
    return {"role": "system" if role == "developer" else role, "content": text}


def _call(item: Mapping[str, Any], param: str) -> dict[str, Any]:
    call_id = _required_str(item, "call_id", param)
    name = _required_str(item, "name", param)
    if item["type"] == "custom_tool_call":
        raw = item.get("input", "")
        if not isinstance(raw, str):
            raise InvalidRequest(f"{param}.input: must be a string", param=f"{param}.input")
        return {"id": call_id, "name": name, "arguments": {"input": raw}}
    raw = item.get("arguments", "{}")
    try:
        arguments = json.loads(raw or "{}") if isinstance(raw, str) else raw
    except ValueError as exc:
        if item.get("status") == "incomplete":
            # A call cut off by the output limit, replayed as it was sent: its text never
            # parsed. (The stored reply holds no such call, so the path matches before it.)
            return {"id": call_id, "name": name, "arguments": {}}
        raise InvalidRequest(f"{param}.arguments: not valid JSON ({exc})",
                             param=f"{param}.arguments") from exc
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"{param}.arguments: must be a JSON object",
                             param=f"{param}.arguments")
    return {"id": call_id, "name": name, "arguments": arguments}


def _required_str(item: Mapping[str, Any], field: str, param: str) -> str:
    value = item.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{param}.{field}: required (a non-empty string)",
                             param=f"{param}.{field}")
    return value


def _text(content: Any, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        raise InvalidRequest(f"{param}: must be a string or a list of parts", param=param)
    parts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            raise InvalidRequest(f"{param}[{j}]: parts of type {kind!r} are not supported "
                                 "(only text)", param=f"{param}[{j}]")
    return "".join(parts)


def split_system(messages: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(texts of the leading system messages, the rest): they join the session's system."""
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    return [m["content"] for m in messages[:n]], messages[n:]


def native_tools(tools: Sequence[Mapping[str, Any]] | None
                 ) -> tuple[tuple[dict[str, Any], ...], frozenset[str]]:
    """(native tools, names of the custom ones). Raises InvalidRequest for a malformed one."""
    out: list[dict[str, Any]] = []
    custom: set[str] = set()
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type")
        if kind not in ("function", "custom"):
            continue  # hosted tools: nothing here runs them
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"tools[{i}].name: required", param=f"tools[{i}].name")
        description = tool.get("description")
        if kind == "custom":
            custom.add(name)
            out.append(function_tool(name, description, CUSTOM_INPUT_SCHEMA))
        else:
            out.append(function_tool(name, description, tool.get("parameters")))
    return tuple(out), frozenset(custom)


def tool_choice_of(raw: str | Mapping[str, Any] | None,
                   tools: Sequence[Mapping[str, Any]]) -> ToolChoice | None:
    """The native tool choice (None without tools). Raises InvalidRequest for a choice naming an
    undeclared tool or a hosted tool."""
    if not tools:
        if raw in (None, "none", "auto"):
            return None
        raise InvalidRequest("tool_choice: names a tool but no function tools are declared",
                             param="tool_choice")
    if raw is None or isinstance(raw, str):
        if raw not in (None, "none", "auto", "required"):
            raise InvalidRequest(f"tool_choice: unknown mode {raw!r}", param="tool_choice")
        return ToolChoice(raw or "auto")  # type: ignore[arg-type]
    name = raw.get("name")
    if raw.get("type") not in ("function", "custom") or not isinstance(name, str):
        raise InvalidRequest(f"tool_choice: type {raw.get('type')!r} is not supported (only "
                             "function and custom tools)", param="tool_choice")
    if name not in {t["function"]["name"] for t in tools}:
        raise InvalidRequest(f"tool_choice: unknown tool {name!r}", param="tool_choice")
    return ToolChoice("named", name)


def message_item(item_id_: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id_, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": []}] if status == "completed" else []}


def call_item(item_id_: str, call: Mapping[str, Any], custom: frozenset[str],
              status: str = "completed") -> dict[str, Any]:
    """A `function_call` (or `custom_tool_call`) item of a native call `{id, name, arguments}`;
    in progress it has empty arguments."""
    done = status == "completed"
    if call["name"] in custom:
        text = str(call["arguments"].get("input", "")) if done else ""
        return {"type": "custom_tool_call", "id": item_id_, "status": status,
                "call_id": call["id"], "name": call["name"], "input": text}
    arguments = json.dumps(call["arguments"], ensure_ascii=False) if done else ""
    return {"type": "function_call", "id": item_id_, "status": status, "call_id": call["id"],
            "name": call["name"], "arguments": arguments}


def with_ids(items: Sequence[Mapping[str, Any]], response_id: str) -> list[dict[str, Any]]:
    """Input items as stored: each keeps its id, or gets `<kind>_<rid>_i<n>`."""
    return [{**item, "id": item.get("id") or item_id(item["type"], response_id, f"i{n}")}
            for n, item in enumerate(items)]
