"""The compatible routes on the real SmolLM2-135M: streamed tool calls that the official clients'
own accumulators assemble into valid JSON (tool_choice required), and a tool-using conversation
resent turn after turn that computes only its delta."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import torch
from openai.lib.streaming.chat import ChatCompletionStreamState

from engine.models.loader import load_model
from tests.compat.conftest import PAGE_SIZE, Live, live_gateway

pytestmark = pytest.mark.slow

READ_FILE: dict[str, Any] = {"type": "function", "function": {
    "name": "read_file", "description": "Read a text file of the repository.",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string", "maxLength": 64},
        "start_line": {"type": "integer", "minimum": 1, "maximum": 10000}},
        "required": ["path"]}}}
SCHEMA = READ_FILE["function"]["parameters"]
TASK = "Find where the JSON decoder reports line numbers. Read the relevant file first."


@pytest.fixture(scope="module")
def real(redis_url: str) -> Iterator[Live]:
    torch.set_num_threads(2)
    with live_gateway(load_model(None), redis_url, "smollm2-135m") as gateway:
        yield gateway


def stored_calls(live: Live, session_id: str) -> list[dict[str, Any]]:
    """The tool calls of the session's newest turn, as the gateway stored them."""
    head = live.session(session_id)["branches"]["main"]
    with live.http() as http:
        calls: list[dict[str, Any]] = http.get(
            f"/v1/sessions/{session_id}/turns/{head}").json()["tool_calls"]
    return calls


# With tool_choice "required" the greedy 135M model keeps calling until max_tokens: the stream
# then ends with complete calls, possibly a truncated last one (finish "length", as the APIs do).
# Every complete call the gateway stored must come out of the client's accumulator as the same
# valid JSON.


def test_openai_streamed_tool_calls_assemble_into_valid_json(real: Live) -> None:
    client = real.openai()
    with client.chat.completions.with_streaming_response.create(
            model="gpt-4o", max_tokens=80, temperature=0, tools=[READ_FILE],
            tool_choice="required", stream=True,
            messages=[{"role": "system", "content": "You are a coding agent."},
                      {"role": "user", "content": TASK}]) as response:
        session_id = response.headers["x-radixgate-session-id"]
        state: ChatCompletionStreamState[object] = ChatCompletionStreamState(
            input_tools=[READ_FILE])
        for chunk in response.parse():
            state.handle_chunk(chunk)
    choice = state.current_completion_snapshot.choices[0]
    assembled = choice.message.tool_calls or []
    stored = stored_calls(real, session_id)
    assert choice.finish_reason in ("tool_calls", "length") and stored
    assert len(assembled) == len(stored) + (choice.finish_reason == "length")
    for call, kept in zip(assembled, stored, strict=False):
        assert (call.id, call.function.name) == (kept["id"], "read_file")
        assert json.loads(call.function.arguments) == kept["arguments"]
        jsonschema.validate(kept["arguments"], SCHEMA)


def test_anthropic_streamed_tool_use_assembles_into_valid_json(real: Live) -> None:
    tool = {"name": "read_file", "description": READ_FILE["function"]["description"],
            "input_schema": SCHEMA}
    with real.anthropic().messages.stream(
            model="claude-sonnet-4-6", max_tokens=80, system="You are a coding agent.",
            tools=[tool], tool_choice={"type": "any"},
            messages=[{"role": "user", "content": TASK}], extra_body={"temperature": 0}) as s:
        session_id = s.response.headers["x-radixgate-session-id"]
        message = s.get_final_message()
    assert message.stop_reason in ("tool_use", "max_tokens")
    uses = [b for b in message.content if b.type == "tool_use"]
    stored = stored_calls(real, session_id)
    assert stored and len(uses) == len(stored) + (message.stop_reason == "max_tokens")
    for block, kept in zip(uses, stored, strict=False):
        assert (block.id, block.name, block.input) == (kept["id"], "read_file",
                                                       kept["arguments"])
        jsonschema.validate(block.input, SCHEMA)


def test_five_tool_turns_compute_only_their_delta(real: Live) -> None:
    client = real.openai()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": TASK}]
    session_ids, usages = set(), []
    for i in range(5):
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=messages, max_tokens=64, temperature=0,
            tools=[READ_FILE],
            tool_choice={"type": "function", "function": {"name": "read_file"}})
        completion = raw.parse()
        session_ids.add(raw.headers["x-radixgate-session-id"])
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "tool_calls" and message.tool_calls
        assert completion.usage is not None and completion.usage.prompt_tokens_details
        usages.append((completion.usage.prompt_tokens, completion.usage.completion_tokens,
                       completion.usage.prompt_tokens_details.cached_tokens or 0))
        messages.append(message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id,
                      "content": f"{i + 1}: def scanstring(s, end): ...  # line {10 * i + 1}"}
                     for c in message.tool_calls]
    assert len(session_ids) == 1
    for (prompt, output, _), (_, _, cached) in zip(usages, usages[1:], strict=False):
        assert prompt + output - PAGE_SIZE <= cached <= prompt + output + 1
    state = real.session(session_ids.pop())
    assert list(state["branches"]) == ["main"]
    assert [t["role"] for t in state["turns"]] == ["root", "user", "assistant"] + [
        "tool", "assistant"] * 4
