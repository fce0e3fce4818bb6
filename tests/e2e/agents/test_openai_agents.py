"""The `openai-agents` SDK, unmodified: an Agent with two function tools on
`OpenAIChatCompletionsModel` over `AsyncOpenAI(base_url=<server>/v1, api_key="anything")`, run with
`Runner.run` against a live `radixgate serve` (tracing export off).

The 135M model does not call a tool on its own, so the agent asks for one through the SDK's own
option `ModelSettings(tool_choice="required")`; the SDK resets the choice to auto after a tool
call (`reset_tool_choice`, its default), so the model then answers in text and the run ends with
a final output. Asserted: both tools ran, their results went back to the model, the run finished,
and the second model call read the first one's tokens from the cache.

- `test_openai_agents_two_tools`: on `OpenAIChatCompletionsModel` (`/v1/chat/completions`).
- `test_openai_agents_responses_two_tools`: the SDK's default model class,
  `OpenAIResponsesModel` (`/v1/responses`), reached through `set_default_openai_client` and a
  model *name*. Twice: with the SDK's default, which resends the whole history on every call
  (each response's `previous_response_id` is null), and with `Runner.run(...,
  auto_previous_response_id=True)`, which chains each call to the last response
  (`previous_response_id`) and sends only the new items (the tool outputs). Either way the calls
  after the first read the cache.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from typing import Any

import pytest

from tests.e2e.agents.live_serve import LiveServer, turn_table

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("agents") is None,
                       reason="openai-agents is not installed (pip install openai-agents)")]


INSTRUCTIONS = "You answer questions about cities. Use the tools to look things up."
QUESTION = "What is the weather and the local time in Paris?"


def city_tools(calls: list[tuple[str, str]]) -> list[Any]:
    """The agent's two function tools; each call is appended to `calls`."""
    from agents import function_tool

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(("get_weather", city))
        return f"Sunny, 21 degrees Celsius in {city}."

    @function_tool
    def get_local_time(city: str) -> str:
        """Get the local time in a city."""
        calls.append(("get_local_time", city))
        return f"It is 14:05 in {city}."

    return [get_weather, get_local_time]


def forced_tool_settings() -> Any:
    from agents import ModelSettings

    return ModelSettings(tool_choice="required", temperature=0, max_tokens=128)


async def run_agent(base_url: str, model_name: str, calls: list[tuple[str, str]]) -> Any:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no export of traces to OpenAI
    client = AsyncOpenAI(base_url=base_url, api_key="anything")
    agent = Agent(
        name="city-assistant", instructions=INSTRUCTIONS,
        model=OpenAIChatCompletionsModel(model=model_name, openai_client=client),
        tools=city_tools(calls), model_settings=forced_tool_settings())
    try:
        return await Runner.run(agent, QUESTION, max_turns=6)
    finally:
        await client.close()


def test_openai_agents_two_tools(live_server: LiveServer) -> None:
    before = set(live_server.session_ids())
    mark = live_server.log_mark()
    calls: list[tuple[str, str]] = []
    started = time.monotonic()
    result = asyncio.run(run_agent(f"{live_server.url}/v1", live_server.model, calls))
    wall = time.monotonic() - started

    print(f"\nopenai-agents: {len(result.raw_responses)} model calls in {wall:.1f} s, "
          f"tool calls {calls}, final output {result.final_output!r}")
    assert {name for name, _ in calls} == {"get_weather", "get_local_time"}
    assert isinstance(result.final_output, str) and result.final_output.strip()
    outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    assert len(outputs) == len(calls)
    usage = [r.usage for r in result.raw_responses]
    assert len(usage) >= 2
    assert all(u.input_tokens_details.cached_tokens > 0 for u in usage[1:])

    assert all(s == 200 for _, path, s in live_server.requests_since(mark)
               if path.startswith("/v1/chat/completions"))
    (sid,) = set(live_server.session_ids()) - before
    turns = live_server.assistant_turns(sid)
    print(turn_table(turns))
    assert [t.cached_tokens for t in turns] == [u.input_tokens_details.cached_tokens
                                               for u in usage]
    assert turns[0].tool_calls and turns[-1].finish_reason == "stop"


async def run_responses_agent(base_url: str, model_name: str, calls: list[tuple[str, str]], *,
                              auto_previous_response_id: bool) -> Any:
    """The same agent on the SDK's default model class: the model is a name, which the default
    provider resolves to `OpenAIResponsesModel` over the default client."""
    from agents import Agent, Runner, set_default_openai_client, set_tracing_disabled
    from agents.models import _openai_shared
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no export of traces to OpenAI
    client = AsyncOpenAI(base_url=base_url, api_key="anything")
    previous_client = _openai_shared.get_default_openai_client()  # put back afterwards
    set_default_openai_client(client, use_for_tracing=False)
    agent = Agent(name="city-assistant", instructions=INSTRUCTIONS, model=model_name,
                  tools=city_tools(calls), model_settings=forced_tool_settings())
    try:
        return await Runner.run(agent, QUESTION, max_turns=6,
                                auto_previous_response_id=auto_previous_response_id)
    finally:
        _openai_shared.set_default_openai_client(previous_client)
        await client.close()


@pytest.mark.parametrize("auto_previous_response_id", [False, True],
                         ids=["full-history", "previous-response-id"])
def test_openai_agents_responses_two_tools(live_server: LiveServer,
                                           auto_previous_response_id: bool) -> None:
    before = set(live_server.session_ids())
    mark = live_server.log_mark()
    calls: list[tuple[str, str]] = []
    started = time.monotonic()
    result = asyncio.run(run_responses_agent(
        f"{live_server.url}/v1", live_server.model, calls,
        auto_previous_response_id=auto_previous_response_id))
    wall = time.monotonic() - started

    mode = "previous_response_id" if auto_previous_response_id else "full history"
    print(f"\nopenai-agents on /v1/responses ({mode}): {len(result.raw_responses)} model calls "
          f"in {wall:.1f} s, tool calls {calls}, final output {result.final_output!r}")
    assert {name for name, _ in calls} == {"get_weather", "get_local_time"}
    assert isinstance(result.final_output, str) and result.final_output.strip()
    outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    assert len(outputs) == len(calls)
    usage = [r.usage for r in result.raw_responses]
    assert len(usage) >= 2
    cached = [u.input_tokens_details.cached_tokens for u in usage]
    print("  cached/input per call:",
          [f"{c}/{u.input_tokens}" for c, u in zip(cached, usage, strict=True)])
    assert all(c > 0 for c in cached[1:]), cached

    requests = [(m, p, s) for m, p, s in live_server.requests_since(mark)
                if p.startswith("/v1/")]
    # Every model call went to /v1/responses (the default model class), none to chat.
    posts = [s for m, p, s in requests if (m, p) == ("POST", "/v1/responses")]
    assert len(posts) == len(requests) == len(usage), requests
    assert all(s == 200 for s in posts), requests
    # How the SDK continued: each stored response names the one it follows, or none.
    ids = [r.response_id for r in result.raw_responses]
    previous = [live_server.http.get(f"/v1/responses/{rid}").json()["previous_response_id"]
                for rid in ids]
    expected = [None, *ids[:-1]] if auto_previous_response_id else [None] * len(ids)
    assert previous == expected, (ids, previous)
    # What the SDK sent after the first call: the whole history again, or only the new items.
    for rid in ids[1:]:
        items = live_server.http.get(f"/v1/responses/{rid}/input_items",
                                     params={"limit": 100, "order": "asc"}).json()["data"]
        kinds = {item["type"] for item in items}
        if auto_previous_response_id:
            assert kinds == {"function_call_output"}, items
        else:
            assert {"message", "function_call", "function_call_output"} <= kinds, items

    (sid,) = set(live_server.session_ids()) - before
    turns = live_server.assistant_turns(sid)
    print(turn_table(turns))
    assert [t.cached_tokens for t in turns] == cached
    assert turns[0].tool_calls and turns[-1].finish_reason == "stop"
