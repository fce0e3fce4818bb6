"""`AgentLoop` / `AsyncAgentLoop` against a live gateway, one body per behaviour for both twins.

On the tiny random model (fast): best_of, retry_from, and a tool loop whose first turn is forced
to call a tool with bounded arguments (`tool_choice={"name": ...}`; constrained decoding makes
even random weights emit a valid call), with its spans. On the real SmolLM2-135M (`slow`): the
loop with `tool_choice="required"` for the first turn and "auto" after. The tool tests skip
while the gateway lacks `generate.tool_choice`. Run the real-model one alone with
`.venv/bin/python -m pytest -q tests/sdk/test_agent_live.py -k real_model`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import sdk
from sdk.tools import tool_message
from tests.examples.live import HAS_TOOL_CALLS, NO_TOOL_CALLS, real_model_gateway
from tests.sdk.test_client_unit import call
from tests.sdk.test_live import TWINS, client_for

STORY = "Tell me a one-sentence story about a fox who finds a lantern in the snow."
ENDINGS = ("Now write a different ending for that story: keep it to one short sentence, "
           "mention the lantern and the snow again, and end on a hopeful note for the fox.")


def loop_type(sync: bool) -> Any:
    return sdk.AgentLoop if sync else sdk.AsyncAgentLoop


def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: The text to count.
    """
    return len(text.split())


def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name, e.g. "Paris".
        unit: "celsius" or "fahrenheit".
    """
    return f"Sunny and 21 degrees {unit} in {city}."


def pick(color: Literal["red", "blue"], loud: bool) -> str:
    """Pick a colour.

    Args:
        color: The colour to pick.
        loud: Whether to shout it.
    """
    return f"picked {color.upper() if loud else color}"


@pytest.mark.skipif(not HAS_TOOL_CALLS, reason=NO_TOOL_CALLS)
@TWINS
def test_tool_loop_runs_the_calls_and_traces_them(sync: bool, live_server: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def body() -> Any:
        client = client_for(sync, live_server)
        loop = await call(loop_type(sync).create(
            client, [pick, word_count], system=f"Tool test ({'sync' if sync else 'async'}).",
            tool_choice="none", max_turns=3, generate={"max_tokens": 128},
            tracer_provider=provider))  # a fixed prompt: greedy output, so the same call
        result = await call(loop.run("Pick a colour.", tool_choice={"name": "pick"}))
        tool_input = await call(loop.session.get_turn(result.turns[-1].turn.parent_id))
        await call(client.close())
        return result, tool_input

    result, tool_input = asyncio.run(body())
    # turn 1 is forced to call `pick`; turn 2 ("none") answers the tool results in text
    assert result.stop_reason == "answered" and len(result.turns) == 2
    first, second = result.turns
    assert first.turn.tool_calls and len(first.tool_results) == len(first.turn.tool_calls)
    for ran in first.tool_results:
        assert ran.call.name == "pick" and ran.call.id and not ran.is_error
        assert ran.content.lower() in ("picked red", "picked blue")
    assert tool_input.role == "tool"
    assert tool_input.messages == [tool_message(r) for r in first.tool_results]
    assert not second.turn.tool_calls and second.cached_tokens > 0

    spans = exporter.get_finished_spans()
    # One run is one trace: `invoke_workflow` is its root, one `invoke_agent` per iteration.
    (root,) = [s for s in spans if s.name == "invoke_workflow radixgate-agent"]
    assert root.parent is None
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    agents = [s for s in spans if s.name == "invoke_agent radixgate-agent"]
    tools = [s for s in spans if s.name == "execute_tool pick"]
    assert len(agents) == 2 and all(a.parent.span_id == root.context.span_id for a in agents)
    assert len(tools) == len(first.tool_results)
    assert all(t.parent.span_id == agents[0].context.span_id for t in tools)
    assert [t.attributes["gen_ai.tool.call.id"] for t in tools] == \
        [r.call.id for r in first.tool_results]
    assert agents[1].attributes["gen_ai.usage.cache_read.input_tokens"] == second.cached_tokens


@TWINS
def test_create_declares_the_tools(sync: bool, live_server: str) -> None:
    async def body() -> None:
        client = client_for(sync, live_server)
        loop = await call(loop_type(sync).create(client, [word_count], system="Be brief."))
        state = await call(loop.session.refresh())
        assert state.tools == [sdk.tool(word_count).to_openai()]
        assert loop.head_turn_id == state.root_turn_id
        await call(client.close())

    asyncio.run(body())


@TWINS
def test_best_of_forks_n_branches_from_one_turn(sync: bool, live_server: str) -> None:
    async def body() -> None:
        client = client_for(sync, live_server)
        # a fresh system prompt: the cache is shared across sessions, so other tests' turns
        # must not hold this conversation's tokens
        loop = await call(loop_type(sync).create(client, system=f"Be brief ({uuid.uuid4()}).",
                                                 generate={"max_tokens": 4}))
        first = await call(loop.run(STORY))
        assert first.stop_reason == "answered" and len(first.turns) == 1
        head = first.turns[0]
        assert head.turn_id == loop.head_turn_id and head.ttft_s is not None and head.ttft_s > 0
        assert head.timings is not None and head.timings["ttft_s"] > 0
        branches = await call(loop.best_of(3, ENDINGS, max_tokens=3, seed=7))
        assert len({r.branch for r in branches}) == 3
        state = await call(loop.session.refresh())
        assert state.branches["main"] == head.turn_id == loop.head_turn_id  # main did not move
        for record in branches:
            assert state.branches[record.branch] == record.turn_id
            assert record.turn.role == "assistant" and record.output_tokens >= 1
            forked_input = await call(loop.session.get_turn(record.turn.parent_id))
            assert forked_input.parent_id == head.turn_id
            assert forked_input.messages == [{"role": "user", "content": ENDINGS}]
        # The message's tokens are computed by the first branch only; the others find them cached.
        computed = [r.computed_tokens for r in branches]
        assert all(c < computed[0] for c in computed[1:]), computed
        assert all(r.cached_tokens > branches[0].cached_tokens for r in branches[1:])
        await call(client.close())

    asyncio.run(body())


@TWINS
def test_retry_from_rewinds_and_runs_again(sync: bool, live_server: str) -> None:
    async def body() -> None:
        client = client_for(sync, live_server)
        loop = await call(loop_type(sync).create(client, system=f"Run {uuid.uuid4()}.",
                                                 generate={"max_tokens": 4}))
        r1 = await call(loop.run("First question: what is two plus two?"))
        second = "Second question, a longer one: what is the capital city of France, and why?"
        r2 = await call(loop.run(second))
        retried = await call(loop.retry_from(r2.final_turn.id, temperature=0.9, seed=5))
        new = retried.final_turn
        assert new.id != r2.final_turn.id and loop.head_turn_id == new.id
        resent = await call(loop.session.get_turn(new.parent_id))
        assert resent.parent_id == r1.final_turn.id
        assert resent.messages == [{"role": "user", "content": second}]
        # the resent input is found in the cache (only the last partial page is computed)
        assert retried.turns[0].computed_tokens < r2.turns[0].computed_tokens
        other = await call(loop.retry_from(r1.final_turn.id, "Third question: and Spain?"))
        state = await call(loop.session.refresh())
        assert state.branches["main"] == other.final_turn.id == loop.head_turn_id
        third_input = await call(loop.session.get_turn(other.final_turn.parent_id))
        assert third_input.parent_id == r1.final_turn.id
        with pytest.raises(ValueError):
            await call(loop.retry_from(state.root_turn_id))
        await call(client.close())

    asyncio.run(body())


# ---- the tool loop on the real model -----------------------------------------------------------


@pytest.fixture(scope="module")
def real_gateway(redis_url: str) -> Iterator[str]:
    with real_model_gateway(redis_url) as base_url:
        yield base_url


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TOOL_CALLS, reason=NO_TOOL_CALLS)
@TWINS
def test_tool_loop_on_the_real_model(sync: bool, real_gateway: str) -> None:
    async def body() -> None:
        client = client_for(sync, real_gateway)
        loop = await call(loop_type(sync).create(
            client, [get_weather, word_count], system="You are a helpful assistant.",
            max_turns=3, generate={"max_tokens": 64}))
        result = await call(loop.run("What is the weather like in Paris today?",
                                     tool_choice="required"))
        first = result.turns[0]
        # "length" when the model went on to a further (cut) call after a complete one
        assert first.turn.tool_calls and first.turn.finish_reason in ("tool_calls", "length")
        assert len(first.tool_results) == len(first.turn.tool_calls)
        for ran in first.tool_results:
            assert ran.call.name in loop.tools and ran.call.id
        assert len(result.turns) >= 2 and len(result.turns) <= 3
        assert result.stop_reason == ("answered" if not result.final_turn.tool_calls
                                      else "max_turns")
        answer = result.turns[1]
        assert answer.cached_tokens > 0 and answer.computed_tokens < answer.input_tokens
        tool_input = await call(loop.session.get_turn(answer.turn.parent_id))
        assert tool_input.role == "tool"
        assert tool_input.messages == [tool_message(r) for r in first.tool_results]
        assert loop.head_turn_id == result.final_turn.id
        await call(client.close())

    asyncio.run(body())
