"""The `openai-agents` SDK, unmodified: an Agent with two function tools on
`OpenAIChatCompletionsModel` over `AsyncOpenAI(base_url=<server>/v1, api_key="anything")`, run with
`Runner.run` against a live `radixgate serve` (tracing export off).

The 135M model does not call a tool on its own, so the agent asks for one through the SDK's own
option `ModelSettings(tool_choice="required")`; the SDK resets the choice to auto after a tool
call (`reset_tool_choice`, its default), so the model then answers in text and the run ends with
a final output. Asserted: both tools ran, their results went back to the model, the run finished,
and the second model call read the first one's tokens from the cache.
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


async def run_agent(base_url: str, model_name: str, calls: list[tuple[str, str]]) -> Any:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no export of traces to OpenAI

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

    client = AsyncOpenAI(base_url=base_url, api_key="anything")
    agent = Agent(
        name="city-assistant",
        instructions="You answer questions about cities. Use the tools to look things up.",
        model=OpenAIChatCompletionsModel(model=model_name, openai_client=client),
        tools=[get_weather, get_local_time],
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=128))
    try:
        return await Runner.run(agent, "What is the weather and the local time in Paris?",
                                max_turns=6)
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
