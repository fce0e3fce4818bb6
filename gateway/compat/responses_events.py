"""The output items and SSE events of one response, built from the turn's events.

One builder serves the three ways a response is told: a stream (`frames` as events arrive), a
plain JSON answer (the same builder fed silently, then `items`), and the replay of a stored
response (`replay_events`: its items as turn events again). So item ids, item order and the
final `output` agree everywhere, and `output_item.done` carries exactly the item that
`response.completed` lists.

Order (responses-api.md §1): created, in_progress; per message item output_item.added,
content_part.added, output_text.delta (with `logprobs: []`)..., output_text.done,
content_part.done, output_item.done; per call output_item.added (arguments ""),
function_call_arguments.delta..., .done (custom tools: custom_tool_call_input.*),
output_item.done; then the terminal event: response.completed, response.incomplete (max
output tokens, or cancelled) or response.failed. Every event has a rising `sequence_number`.
A message opens at the first non-empty text; text after a call opens another message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gateway.compat.responses_items import call_item, item_id, message_item
from gateway.toolcall_events import TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart

ItemEvent = TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd
_TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete",
             "cancelled": "response.incomplete", "failed": "response.failed"}


class ResponseEvents:
    """Mutable, one per response. `response` is the response object in progress; `items` the
    output items so far, in order, each in its final form once done."""

    def __init__(self, response: dict[str, Any], custom_tools: frozenset[str]) -> None:
        self.response = response
        self.custom_tools = custom_tools
        self.items: list[dict[str, Any]] = []
        self.num_events = 0
        self._text_index: int | None = None  # output index of the open message
        self._calls: dict[int, int] = {}  # open tool call's index -> output index
        self._call_args: dict[int, list[str]] = {}  # open tool call's index -> argument text
        self._open_text_parts: list[str] = []  # the open message's text so far

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.num_events, **fields}
        self.num_events += 1
        return event

    def begin(self) -> list[dict[str, Any]]:
        snapshot = {**self.response, "status": "in_progress", "output": []}
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def feed(self, event: ItemEvent) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):
            return self._text(event.text)
        out = self._close_text()
        if isinstance(event, ToolCallStart):
            index = len(self.items)
            self._calls[event.index] = index
            self._call_args[event.index] = []
            kind = "custom_tool_call" if event.name in self.custom_tools else "function_call"
            item = call_item(item_id(kind, self.response["id"], f"o{index}"),
                             {"id": event.id, "name": event.name, "arguments": {}},
                             self.custom_tools, status="in_progress")
            self.items.append(item)
            out.append(self._event("response.output_item.added", output_index=index,
                                   item=dict(item)))
        elif isinstance(event, ToolCallDelta):
            index = self._calls[event.index]
            item = self.items[index]
            self._call_args[event.index].append(event.arguments)
            if item["type"] == "function_call":
                out.append(self._event("response.function_call_arguments.delta",
                                       item_id=item["id"], output_index=index,
                                       delta=event.arguments))
        else:
            out.extend(self._end_call(event))
        return out

    def _text(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        out = self._open_text() if self._text_index is None else []
        index = self._text_index
        assert index is not None
        self._open_text_parts.append(text)
        out.append(self._event("response.output_text.delta", item_id=self.items[index]["id"],
                               output_index=index, content_index=0, delta=text, logprobs=[]))
        return out

    def _open_text(self) -> list[dict[str, Any]]:
        index = self._text_index = len(self.items)
        self._open_text_parts = []
        item = message_item(item_id("message", self.response["id"], f"o{index}"), "",
                            status="in_progress")
        self.items.append(item)
        return [self._event("response.output_item.added", output_index=index, item=dict(item)),
                self._event("response.content_part.added", item_id=item["id"],
                            output_index=index, content_index=0, part=_part(""))]

    def _close_text(self) -> list[dict[str, Any]]:
        if self._text_index is None:
            return []
        index, self._text_index = self._text_index, None
        text = "".join(self._open_text_parts)
        done = self.items[index] = message_item(self.items[index]["id"], text)
        return [self._event("response.output_text.done", item_id=done["id"],
                            output_index=index, content_index=0, text=text, logprobs=[]),
                self._event("response.content_part.done", item_id=done["id"],
                            output_index=index, content_index=0, part=_part(text)),
                self._event("response.output_item.done", output_index=index, item=done)]

    def _end_call(self, event: ToolCallEnd) -> list[dict[str, Any]]:
        index = self._calls.pop(event.index)
        self._call_args.pop(event.index, None)
        done = self.items[index] = call_item(
            self.items[index]["id"], {"id": event.id, "name": event.name,
                                      "arguments": event.arguments}, self.custom_tools)
        if done["type"] == "custom_tool_call":
            detail = [self._event("response.custom_tool_call_input.delta", item_id=done["id"],
                                  output_index=index, delta=done["input"]),
                      self._event("response.custom_tool_call_input.done", item_id=done["id"],
                                  output_index=index, input=done["input"])]
        else:
            detail = [self._event("response.function_call_arguments.done", item_id=done["id"],
                                  output_index=index, name=done["name"],
                                  arguments=done["arguments"])]
        return [*detail, self._event("response.output_item.done", output_index=index,
                                     item=done)]

    def finish(self) -> list[dict[str, Any]]:
        """Close what is open (a call cut short by the token limit stays `incomplete`, with the
        arguments it got); a response with no output gets an empty message."""
        out = self._close_text()
        for call, index in sorted(self._calls.items()):
            item = self.items[index]
            text = "".join(self._call_args.pop(call, []))
            item.update({"status": "incomplete",
                         "input" if item["type"] == "custom_tool_call" else "arguments": text})
            out.append(self._event("response.output_item.done", output_index=index,
                                   item=dict(item)))
        self._calls.clear()
        if not self.items:
            out.extend(self._open_text())
            out.extend(self._close_text())
        return out

    def terminal(self, response: Mapping[str, Any]) -> dict[str, Any]:
        """The closing event for the final `response` (its status picks the type)."""
        return self._event(_TERMINAL.get(str(response["status"]), "response.completed"),
                           response=dict(response))


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def replay_events(output: Sequence[Mapping[str, Any]]) -> Iterator[ItemEvent]:
    """A stored response's output items as the turn events that produced them."""
    for n, item in enumerate(output):
        if item.get("type") == "message":
            yield TextDelta("".join(p.get("text", "") for p in item.get("content", ())))
        elif item.get("type") in ("function_call", "custom_tool_call"):
            custom = item["type"] == "custom_tool_call"
            arguments = {"input": item.get("input", "")} if custom else json.loads(
                item.get("arguments") or "{}")
            yield ToolCallStart(n, item["call_id"], item["name"])
            if not custom:
                yield ToolCallDelta(n, item.get("arguments", ""))
            yield ToolCallEnd(n, item["call_id"], item["name"], arguments)


def sse(event: Mapping[str, Any]) -> bytes:
    """One SSE frame (`event:` line and JSON `data`)."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
