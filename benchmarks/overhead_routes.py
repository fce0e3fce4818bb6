"""One streamed turn through each route, timed as a client sees it: POST to the first text.

Each function sends the turn over a plain httpx client (no SDK parsing in the timing), reads
SSE lines until the first piece of text arrives (client TTFT), drains the rest, and returns
the input turn id the gateway names, so the caller can match the engine's own TTFT from the
turn's `chat` span. `Conversation` keeps each route's growing history the way its clients do:
the native route sends only the new message, the compatible routes the whole conversation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class Timed:
    input_turn_id: str
    client_ttft_s: float
    total_s: float
    text: str


@dataclass
class Conversation:
    route: str  # "native" | "openai" | "anthropic"
    session_id: str | None = None  # the native route's session
    messages: list[dict[str, Any]] = field(default_factory=list)  # the compatible routes'


def _sse(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    event = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and line != "data: [DONE]":
            yield event, json.loads(line.removeprefix("data: "))


def streamed_turn(http: httpx.Client, conv: Conversation, text: str,
                  max_tokens: int) -> Timed:
    """One streamed turn of `text` on `conv`'s route; `conv` grows by the turn."""
    if conv.route == "native":
        path = f"/v1/sessions/{conv.session_id}/turns"
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}],
                                "generate": {"max_tokens": max_tokens, "stream": True}}
    else:
        conv.messages.append({"role": "user", "content": text})
        path = "/v1/chat/completions" if conv.route == "openai" else "/v1/messages"
        body = {"model": "gpt-4o" if conv.route == "openai" else "claude-sonnet-4-5",
                "messages": conv.messages, "max_tokens": max_tokens, "temperature": 0,
                "stream": True}
    started = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    input_turn_id = ""
    with http.stream("POST", path, json=body) as r:
        r.raise_for_status()
        input_turn_id = r.headers.get("x-radixgate-input-turn-id", "")
        for event, data in _sse(r):
            piece = _text_of(conv.route, event, data)
            if event == "turn_start":
                input_turn_id = data["input_turn_id"]
            if piece:
                first = first if first is not None else time.perf_counter() - started
                pieces.append(piece)
            if event == "error" or "error" in data and conv.route == "openai":
                raise RuntimeError(f"turn failed: {data}")
    total = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"no text came back on the {conv.route} route")
    reply = "".join(pieces)
    if conv.route != "native":
        conv.messages.append({"role": "assistant", "content": reply})
    return Timed(input_turn_id, first, total, reply)


def _text_of(route: str, event: str, data: dict[str, Any]) -> str:
    if route == "native":
        return str(data.get("text", "")) if event == "text_delta" else ""
    if route == "openai":
        choices = data.get("choices") or [{}]
        return str((choices[0].get("delta") or {}).get("content") or "")
    if event == "content_block_delta" and data["delta"].get("type") == "text_delta":
        return str(data["delta"]["text"])
    return ""
