"""`/v1/responses` through the official `openai` client against a live gateway on the tiny random
model: create, chains and forks through `previous_response_id`, full resends placed by prefix,
tool calls, retrieve, delete, `input_items`, `input_tokens`, tenants, and bad input."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from redis.asyncio import Redis

from sessions import SessionStore
from tests.compat.conftest import Live

FLAT_WEATHER: dict[str, Any] = {
    "type": "function", "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}


def _sessions(live: Live, tenant: str = "alpha") -> list[str]:
    async def run() -> list[str]:
        client = Redis.from_url(live.redis_url)
        try:
            return await SessionStore(client, key_prefix=live.key_prefix).list_sessions(tenant)
        finally:
            await client.aclose()
    return asyncio.run(run())


def _turns(live: Live, session_id: str) -> list[dict[str, Any]]:
    """Every turn of the session in full (messages, calls)."""
    state = live.session(session_id)
    with live.http() as http:
        return [http.get(f"/v1/sessions/{session_id}/turns/{t['id']}").json()
                for t in state["turns"]]


def test_create_chain_and_fork_on_the_turn_tree(live: Live) -> None:
    client = live.openai()
    raw = client.responses.with_raw_response.create(
        model="gpt-4.1-mini", instructions="You answer the Responses test.", input="hello",
        max_output_tokens=6, temperature=0)
    first = raw.parse()
    session_id = raw.headers["x-radixgate-session-id"]
    assert first.id.startswith("resp_") and first.object == "response"
    assert first.status in ("completed", "incomplete") and first.model == "gpt-4.1-mini"
    assert first.instructions == "You answer the Responses test."
    [message] = first.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.id.startswith("msg_")
    assert first.output_text == message.content[0].text
    assert first.usage is not None and first.usage.output_tokens >= 1
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens

    # A chain: only the new input is sent; the tree holds the rest, and the cache has it.
    second = client.responses.with_raw_response.create(
        model="gpt-4.1-mini", instructions="You answer the Responses test.",
        previous_response_id=first.id, input="and then?", max_output_tokens=6, temperature=0)
    chained = second.parse()
    assert second.headers["x-radixgate-session-id"] == session_id
    assert chained.previous_response_id == first.id
    assert chained.usage is not None and chained.usage.input_tokens > first.usage.input_tokens
    assert chained.usage.input_tokens_details.cached_tokens >= 16

    # Two responses on one parent: the second forks a branch; both succeed.
    fork = client.responses.with_raw_response.create(
        model="gpt-4.1-mini", instructions="You answer the Responses test.",
        previous_response_id=first.id, input="something else", max_output_tokens=4,
        temperature=0)
    assert fork.headers["x-radixgate-session-id"] == session_id
    state = live.session(session_id)
    assert len(state["branches"]) == 2
    parents = {t["id"]: t["parent_id"] for t in state["turns"]}
    first_turn = client.responses.retrieve(first.id)
    assert first_turn.id == first.id and first_turn.output[0].id == message.id
    assert sum(1 for p in parents.values() if p == _reply_turn(state, parents, first)) == 2


def _reply_turn(state: dict[str, Any], parents: dict[str, str], first: Any) -> str:
    """The assistant turn of `first` (the one two input turns hang under)."""
    counts: dict[str, int] = {}
    for parent in parents.values():
        counts[parent] = counts.get(parent, 0) + 1
    return max((t["id"] for t in state["turns"] if t["role"] == "assistant"),
               key=lambda t: counts.get(t, 0))


def test_instructions_are_not_carried_over(live: Live) -> None:
    client = live.openai()
    first = client.responses.create(model="gpt-4.1-mini", instructions="Be terse.",
                                    input="hi", max_output_tokens=4, temperature=0)
    raw = client.responses.with_raw_response.create(
        model="gpt-4.1-mini", previous_response_id=first.id, input="again",
        max_output_tokens=4, temperature=0)
    after = raw.parse()
    assert after.instructions is None
    # Rebuilt under a root without the instructions: another session, history intact.
    session_id = raw.headers["x-radixgate-session-id"]
    texts = [m["content"] for t in _turns(live, session_id) for m in t["messages"]]
    assert "hi" in texts and "again" in texts
    assert live.session(session_id)["system"] in (None, "")


def test_full_resend_with_tool_items_is_placed_by_prefix(live: Live) -> None:
    client = live.openai()
    history: list[dict[str, Any]] = [
        {"role": "developer", "content": "You call tools."},
        {"role": "user", "content": "Weather in Paris?"}]
    raw = client.responses.with_raw_response.create(
        model="gpt-4.1-mini", input=history, tools=[FLAT_WEATHER], tool_choice="required",
        parallel_tool_calls=False, store=False, max_output_tokens=64, temperature=0)
    first = raw.parse()
    session_id = raw.headers["x-radixgate-session-id"]
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.status == "completed"
    # Replayed as Codex does: items without ids or status, the call's output after it.
    history += [{"type": "function_call", "call_id": call.call_id, "name": call.name,
                 "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id,
                 "output": "18 degrees, sunny"},
                {"type": "reasoning", "summary": [], "encrypted_content": None},
                # What Codex may replay: a call cut off by the output limit, and a result of
                # one of its own tools named without a call id.
                {"type": "function_call", "call_id": "call_cut", "name": call.name,
                 "arguments": '{"city": "Par', "status": "incomplete"},
                {"type": "function_call_output", "name": "goal_objective", "output": "noted"}]
    second = client.responses.with_raw_response.create(
        model="gpt-4.1-mini", input=history, tools=[FLAT_WEATHER], store=False,
        max_output_tokens=6, temperature=0)
    resent = second.parse()
    assert second.headers["x-radixgate-session-id"] == session_id
    assert resent.usage is not None and first.usage is not None
    assert resent.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16
    with pytest.raises(openai.NotFoundError):  # store: false keeps no record
        client.responses.retrieve(first.id)
    assert any(m.get("role") == "tool" and m.get("content") == "18 degrees, sunny"
               for t in _turns(live, session_id) for m in t["messages"])


def test_chained_tool_call_output_and_input_items(live: Live) -> None:
    client = live.openai()
    first = client.responses.create(
        model="gpt-4.1-mini", input="Weather in Rome?", tools=[FLAT_WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64,
        temperature=0)
    [call] = first.output
    assert call.type == "function_call"
    items = [{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"},
             {"type": "reasoning", "id": "rs_client", "summary": [],
              "encrypted_content": "opaque-blob"},
             {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]}]
    second = client.responses.create(model="gpt-4.1-mini", previous_response_id=first.id,
                                     input=items, tools=[FLAT_WEATHER], max_output_tokens=4,
                                     temperature=0)
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0
    page = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in page.data] == ["function_call_output", "reasoning", "message"]
    assert page.data[1].id == "rs_client" and page.data[1].encrypted_content == "opaque-blob"
    assert page.has_more is False and page.first_id == page.data[0].id
    one = client.responses.input_items.list(second.id, limit=1)  # newest first
    assert [i.type for i in one.data] == ["message"] and one.has_more is True
    rest = client.responses.input_items.list(second.id, limit=5, after=one.last_id)
    assert [i.type for i in rest.data] == ["reasoning", "function_call_output"]


def test_retrieve_delete_tenants_and_input_tokens(live: Live) -> None:
    client = live.openai()
    made = client.responses.create(model="gpt-4.1-mini", input="keep me", max_output_tokens=3,
                                   metadata={"k": "v"}, temperature=0)
    assert made.metadata == {"k": "v"}
    with pytest.raises(openai.NotFoundError):
        live.openai(live.other_key).responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        live.openai(live.other_key).responses.delete(made.id)
    assert client.responses.retrieve(made.id).output_text == made.output_text
    counted = client.responses.input_tokens.count(model="gpt-4.1-mini", input="keep me")
    assert counted.input_tokens == made.usage.input_tokens if made.usage else False
    chained = client.responses.input_tokens.count(model="gpt-4.1-mini", input="more",
                                                  previous_response_id=made.id)
    assert chained.input_tokens > counted.input_tokens
    client.responses.delete(made.id)
    with httpx.Client(base_url=live.base_url, headers={"Authorization": f"Bearer {live.key}"}
                      ) as http:
        gone = http.get(f"/v1/responses/{made.id}")
    assert gone.status_code == 404
    body = gone.json()["error"]
    assert body["type"] == "invalid_request_error" and made.id in body["message"]


@pytest.mark.parametrize("request_body, param", [
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
     "input[0].call_id"),
    ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "telepathy"}]}, "input[0].type"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "x", "tools": [FLAT_WEATHER], "tool_choice": {"type": "function",
                                                              "name": "nope"}}, "tool_choice"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
     "input[0].arguments"),
])
def test_bad_input_is_a_400_naming_the_param(live: Live, request_body: dict[str, Any],
                                             param: str) -> None:
    before = set(_sessions(live))
    with httpx.Client(base_url=live.base_url, headers={"Authorization": f"Bearer {live.key}"}
                      ) as http:
        r = http.post("/v1/responses", json={"model": "gpt-4.1-mini", **request_body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert set(_sessions(live)) == before  # nothing left behind


def test_conversation_is_a_moving_branch_head(live: Live) -> None:
    client = live.openai()
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Hi, I am Ada."}],
        metadata={"topic": "names"})
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "names"}
    first = client.responses.with_raw_response.create(
        model="gpt-4.1-mini", conversation=conversation.id, input="What is my name?",
        max_output_tokens=4, temperature=0)
    parsed = first.parse()
    assert parsed.conversation is not None and parsed.conversation.id == conversation.id
    second = client.responses.with_raw_response.create(
        model="gpt-4.1-mini", conversation={"id": conversation.id}, input="Say it again.",
        max_output_tokens=4, temperature=0).parse()
    # Continued under the first reply: one session, the history read from the cache.
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens >= 16
    items = client.conversations.items.list(conversation.id, order="asc")
    assert [i.type for i in items.data] == ["message"] * 5
    assert items.data[4].id == second.output[0].id == items.last_id
    assert items.data[2].id == parsed.output[0].id
    one = client.conversations.items.retrieve(items.data[1].id, conversation_id=conversation.id)
    assert one.id == items.data[1].id
    # Deleting an item the anchor covers: the next response is placed from the whole log.
    client.conversations.items.delete(items.data[0].id, conversation_id=conversation.id)
    third = client.responses.create(model="gpt-4.1-mini", conversation=conversation.id,
                                    input="And now?", max_output_tokens=3, temperature=0)
    assert third.status in ("completed", "incomplete")
    assert len(client.conversations.items.list(conversation.id).data) == 6
    updated = client.conversations.update(conversation.id, metadata={"topic": "other"})
    assert updated.metadata == {"topic": "other"}
    with pytest.raises(openai.NotFoundError):
        live.openai(live.other_key).conversations.retrieve(conversation.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="gpt-4.1-mini", conversation=conversation.id,
                                previous_response_id=third.id, input="x")
    assert client.conversations.delete(conversation.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_prompt_cache_key_names_the_session(live: Live) -> None:
    client = live.openai()
    sessions = set()
    for text in ("first conversation", "an unrelated one"):
        raw = client.responses.with_raw_response.create(
            model="gpt-4.1-mini", input=text, store=False, prompt_cache_key="agent-7",
            max_output_tokens=2, temperature=0)
        sessions.add(raw.headers["x-radixgate-session-id"])
    other = client.responses.with_raw_response.create(
        model="gpt-4.1-mini", input="first conversation", store=False,
        prompt_cache_key="agent-8", max_output_tokens=2, temperature=0)
    assert len(sessions) == 1  # one session (one worker) per key, whatever the prompt
    assert other.headers["x-radixgate-session-id"] not in sessions
