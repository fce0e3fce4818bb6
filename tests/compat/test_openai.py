"""`POST /v1/chat/completions` and `GET /v1/models` through the official `openai` client against a
live gateway on the tiny random model: text, streaming with usage, a streamed tool call, errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.compat.conftest import MAX_BODY_BYTES, PAGE_SIZE, WEATHER_TOOL, Live

NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_text_then_streamed_continuation_reports_cached_tokens(live: Live) -> None:
    client = live.openai()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You answer the OpenAI text test."},
        {"role": "user", "content": "hello"}]
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=messages, max_tokens=6, temperature=0)
    first = raw.parse()
    session_id = raw.headers["x-radixgate-session-id"]
    assert first.object == "chat.completion" and first.model == "gpt-4o-mini"
    assert first.id.startswith("chatcmpl-") and len(first.choices) == 1
    choice = first.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    assert first.usage is not None and first.usage.completion_tokens >= 1
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert first.usage.prompt_tokens_details is not None

    messages += [{"role": "assistant", "content": choice.message.content},
                 {"role": "user", "content": "and then?"}]
    with client.chat.completions.with_streaming_response.create(
            model="gpt-4o-mini", messages=messages, max_tokens=6, temperature=0,
            stream=True, stream_options={"include_usage": True}) as response:
        assert response.headers["x-radixgate-session-id"] == session_id  # the same tree
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = list(response.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].object == "chat.completion.chunk"
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0] is chunks[-2]
    assert finishing[0].choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in chunks[:-1])
    final = chunks[-1]
    assert final.choices == [] and final.usage is not None
    assert final.usage.completion_tokens >= 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    state = live.session(session_id)
    reply = state["turns"][-1]
    assert reply["role"] == "assistant" and state["branches"] == {"main": reply["id"]}
    with live.http() as http:
        stored = http.get(f"/v1/sessions/{session_id}/turns/{reply['id']}").json()
    assert stored["content"] == text
    # Only the delta was computed: the cache covers the first turn's whole context but the
    # partial last page.
    cached = final.usage.prompt_tokens_details.cached_tokens
    previous = first.usage.prompt_tokens + first.usage.completion_tokens
    assert previous - PAGE_SIZE <= cached <= previous + 1


def test_streamed_tool_call_deltas_assemble_in_the_client(live: Live) -> None:
    client = live.openai()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in a city?"}]
    with client.chat.completions.stream(
            model="gpt-4o", messages=messages, max_tokens=64, temperature=0,
            tools=[WEATHER_TOOL], tool_choice=NAMED) as stream:
        events = list(stream)
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments["city"] in ("Paris", "Rome", "Oslo") and arguments["unit"] in (
        "celsius", "fahrenheit")
    chunks = [e.chunk for e in events if e.type == "chunk"]
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].id == call.id and deltas[0].function is not None
    assert (deltas[0].type, deltas[0].function.name, deltas[0].function.arguments) == (
        "function", "get_weather", "")
    assert all(d.index == 0 and d.id is None and d.function is not None
               and d.function.name is None for d in deltas[1:])
    assert len(deltas) > 2  # the arguments arrived in fragments

    # The tool result goes back with the whole history; the call's turn is the anchor.
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = client.chat.completions.create(
        model="gpt-4o", messages=messages, max_tokens=64, temperature=0,
        tools=[WEATHER_TOOL], tool_choice="none")
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens > 0


def test_errors_use_the_openai_envelope(live: Live) -> None:
    client = live.openai()
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as auth:
        live.openai("rg-wrong").chat.completions.create(model="gpt-4o", messages=hi)
    assert auth.value.status_code == 401
    assert auth.value.body["type"] == "authentication_error"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="llama-70b", messages=hi)
    assert missing.value.code == "model_not_found" and "llama-70b" in missing.value.message
    cases: list[dict[str, Any]] = [
        {"messages": []}, {"messages": hi, "n": 2}, {"messages": hi, "max_tokens": 0},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"messages": hi, "tool_choice": NAMED},
        {"messages": [{"role": "assistant", "content": "x", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
            {"role": "user", "content": "hi"}]}]
    for extra in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="gpt-4o", **extra)
        body = bad.value.body
        assert isinstance(body, dict) and body["type"] == "invalid_request_error", body
        assert body["message"] and "param" in body and body["code"]
    with httpx.Client(base_url=live.base_url) as http:
        r = http.post("/v1/chat/completions", content=b"x" * (MAX_BODY_BYTES + 1),
                      headers={"Authorization": f"Bearer {live.key}"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


def test_models_list_and_retrieve(live: Live) -> None:
    client = live.openai()
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].object == "model" and models.data[0].owned_by == "radixgate"
    with live.http() as http:  # Codex CLI's catalogue rides along in the same body
        [entry] = http.get("/v1/models").json()["models"]
    assert entry["slug"] == "tiny" and entry["context_window"] > 0
    assert entry["base_instructions"] and entry["shell_type"] == "shell_command"
    assert client.models.retrieve("gpt-4.1").id == "gpt-4.1"  # an alias answers as itself
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("llama-70b")
