"""`POST /v1/messages`, `/v1/messages/count_tokens` and `GET /v1/models` through the official
`anthropic` client against a live gateway on the tiny random model: text, the exact SSE framing,
a streamed tool_use block, unknown fields and betas tolerated, auth styles and error envelopes."""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import httpx
import pytest

from tests.compat.conftest import PAGE_SIZE, WEATHER_TOOL, Live

TOOL = {"name": "get_weather", "description": WEATHER_TOOL["function"]["description"],
        "input_schema": WEATHER_TOOL["function"]["parameters"]}
# What Claude Code sends besides the basics (wire-formats.md §8).
BETAS = "claude-code-20250219,context-management-2025-06-27,prompt-caching-scope-2026-01-05"
EXTRA_BODY = {"context_management": {"edits": []}, "thinking": {"type": "disabled"},
              "metadata": {"user_id": "u1"}}
# This client version has no sampling parameters; the API's own (temperature...) still apply.
GREEDY = {"temperature": 0}


def sse_frames(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of each frame; asserts the framing (event line, data line, blank line)."""
    frames = []
    for block in text.split("\n\n"):
        if not block:
            continue
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: "), block
        frames.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return frames


def test_text_then_streamed_continuation_reports_cache_reads(live: Live) -> None:
    client = live.anthropic(default_headers={"anthropic-beta": BETAS})
    system = [{"type": "text", "text": "You answer the Anthropic text test.",
               "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}]}]
    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4-6", max_tokens=6, system=system,
        messages=messages, extra_body={**EXTRA_BODY, **GREEDY})
    first = raw.parse()
    session_id = raw.headers["x-radixgate-session-id"]
    assert first.type == "message" and first.role == "assistant"
    assert first.model == "claude-sonnet-4-6" and first.id.startswith("msg_")
    assert [b.type for b in first.content] == ["text"]
    assert first.stop_reason in ("end_turn", "max_tokens") and first.stop_sequence is None
    assert first.usage.output_tokens >= 1 and first.usage.cache_creation_input_tokens == 0
    first_context = (first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
                     + first.usage.output_tokens)

    messages += [{"role": "assistant", "content": first.content[0].text},
                 {"role": "user", "content": "and then?"}]
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=6, system=system,
                                messages=messages,
                                extra_body={**EXTRA_BODY, **GREEDY}) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == final.content[0].text
    cached = final.usage.cache_read_input_tokens or 0
    assert first_context - PAGE_SIZE <= cached <= first_context + 1
    state = live.session(session_id)
    assert state["branches"] == {"main": state["turns"][-1]["id"]}
    assert [t["role"] for t in state["turns"]] == ["root", "user", "assistant"] * 1 + [
        "user", "assistant"]


def test_stream_framing_is_exact(live: Live) -> None:
    with httpx.Client(base_url=live.base_url, timeout=60) as http:
        r = http.post("/v1/messages", headers={"x-api-key": live.key,
                                               "anthropic-version": "2023-06-01"},
                      json={"model": "claude-opus-4-1", "max_tokens": 5, "stream": True,
                            "messages": [{"role": "user", "content": "framing"}]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(r.text)
    assert all(event == data["type"] for event, data in frames)
    names = " ".join(event for event, _ in frames)
    assert re.fullmatch(r"message_start ping content_block_start( content_block_delta)+ "
                        r"content_block_stop message_delta message_stop", names), names
    start = frames[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert set(start["usage"]) >= {"input_tokens", "output_tokens", "cache_read_input_tokens"}
    assert frames[2][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}
    delta = frames[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 5


def test_streamed_tool_use_assembles_in_the_client(live: Live) -> None:
    client = live.anthropic(auth_token=live.key, api_key=None)  # Bearer instead of x-api-key
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather somewhere?"}]
    with client.messages.stream(model="claude-sonnet-4-6", max_tokens=64, extra_body=GREEDY,
                                messages=messages, tools=[TOOL],
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = list(stream)
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert set(block.input) == {"city", "unit"}
    fragments = [e.delta.partial_json for e in events
                 if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(fragments) > 2 and json.loads("".join(fragments)) == block.input

    messages += [{"role": "assistant", "content": [b.model_dump() for b in message.content]},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": block.id, "content": "sunny"},
                     {"type": "text", "text": "Thanks. Summarise."}]}]
    reply = client.messages.create(model="claude-sonnet-4-6", max_tokens=8, extra_body=GREEDY,
                                   messages=messages, tools=[TOOL],
                                   tool_choice={"type": "none"})
    assert reply.content[0].type == "text" and reply.stop_reason in ("end_turn", "max_tokens")
    assert (reply.usage.cache_read_input_tokens or 0) > 0


def test_count_tokens_matches_the_prompt(live: Live) -> None:
    client = live.anthropic()
    request: dict[str, Any] = {
        "model": "claude-sonnet-4-6", "system": "Count test.", "tools": [TOOL],
        "messages": [{"role": "user", "content": "how many tokens is this?"}]}
    counted = client.messages.count_tokens(**request)
    reply = client.messages.create(max_tokens=1, **request)
    assert counted.input_tokens == reply.usage.input_tokens + (
        reply.usage.cache_read_input_tokens or 0)


def test_errors_use_the_anthropic_envelope(live: Live) -> None:
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.AuthenticationError) as auth:
        live.anthropic("rg-wrong").messages.create(model="claude-x", max_tokens=4, messages=hi)
    body = auth.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"] == {"type": "authentication_error", "message": "invalid API key"}
    client = live.anthropic()
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="llama-3-70b", max_tokens=4, messages=hi)
    assert missing.value.body["error"]["type"] == "not_found_error"
    cases: list[dict[str, Any]] = [
        {"model": "claude-x", "messages": hi},  # no max_tokens
        {"model": "claude-x", "max_tokens": 4, "messages": []},
        {"model": "claude-x", "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {}}]}]},
        {"model": "claude-x", "max_tokens": 4, "messages": [*hi, {"role": "assistant",
                                                                  "content": "prefill"}]},
        {"model": "claude-x", "max_tokens": 4, "messages": hi,
         "tool_choice": {"type": "any"}}]
    with httpx.Client(base_url=live.base_url, headers={"x-api-key": live.key}) as http:
        for case in cases:
            r = http.post("/v1/messages", json=case)
            assert r.status_code == 400, (case, r.text)
            body = r.json()
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
            assert body["error"]["message"]


def test_models_in_the_anthropic_shape(live: Live) -> None:
    page = live.anthropic().models.list()
    assert [m.id for m in page.data] == ["tiny"] and page.data[0].type == "model"
    with httpx.Client(base_url=live.base_url, headers={"x-api-key": live.key,
                                                       "anthropic-version": "2023-06-01"}) as h:
        body = h.get("/v1/models").json()
        assert body["has_more"] is False and body["first_id"] == body["last_id"] == "tiny"
        missing = h.get("/v1/models/llama-3-70b")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_stop_sequences(live: Live) -> None:
    client = live.anthropic()
    request: dict[str, Any] = {"model": "claude-x", "max_tokens": 8, "extra_body": GREEDY,
                               "messages": [{"role": "user", "content": "stop test"}]}
    free = client.messages.create(**request).content[0].text
    words = free.split()
    assert len(words) >= 3, free
    stop = " " + words[2]
    cut = client.messages.create(stop_sequences=[stop], **request)
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert cut.content[0].text == free[: free.index(stop)]
    both = client.messages.create(stop_sequences=[stop, "never"], **request)
    assert (both.stop_reason, both.stop_sequence) == ("stop_sequence", None)
