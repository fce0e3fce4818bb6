"""The agent loop's rules, driven with real `sdk.types` turns and real tools: the step rule, the
run state across tool-call turns, retry planning, timing and the turn table. The HTTP side is
covered against a live gateway in `test_agent_live.py`."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import sdk
from sdk._agent import (
    RunState,
    Step,
    StreamTiming,
    advance,
    best_of_branches,
    make_record,
    next_step,
    observe,
    retry_plan,
    start_run,
    tool_table,
    turn_attributes,
)
from sdk.tools import ToolCall, run_tool
from sdk.types import TextDelta, Turn, TurnEnd, TurnStart, Usage
from sessions.keys import is_valid_branch


def make_turn(turn_id: str, *, role: str = "assistant", parent_id: str | None = "in",
              tool_calls: list[dict[str, Any]] | None = None, content: str | None = None,
              usage: tuple[int, int, int, int] | None = (40, 32, 8, 6),
              messages: list[dict[str, Any]] | None = None, branch: str | None = "main") -> Turn:
    tool_calls = tool_calls or []
    return Turn(id=turn_id, session_id="s1", parent_id=parent_id, role=role, depth=2, version=3,
                created_ms=0, num_tokens=6, content=content, tool_calls=tool_calls,
                messages=messages or [],
                usage=Usage(input_tokens=usage[0], cached_tokens=usage[1],
                            computed_tokens=usage[2], output_tokens=usage[3]) if usage else None,
                finish_reason=("tool_calls" if tool_calls else "stop") if role == "assistant"
                else None, branch=branch)


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: Any text.
    """
    return len(text.split())


def fail(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


async def async_tool(x: int) -> int:
    """Async."""
    return x


TOOLS = tool_table([word_count, fail], allow_async=False)


def test_next_step() -> None:
    assert next_step(make_turn("a1", content="done"), 1, 3) == Step(stop_reason="answered")
    asking = make_turn("a1", tool_calls=[call("c1", "word_count", text="a b"),
                                         {"id": "c2", "name": "fail", "arguments": "{}"}])
    assert next_step(asking, 2, 3) == Step(calls=(ToolCall("c1", "word_count", {"text": "a b"}),
                                                  ToolCall("c2", "fail", {})))
    assert next_step(asking, 3, 3) == Step(stop_reason="max_turns")


def drive(state: RunState, turns: list[Turn]) -> tuple[RunState, list[list[Any]]]:
    """Feed `turns` through the loop's state machine, running the tools for real; return the
    final state and the messages each turn after the first was appended with."""
    sent = []
    for n, turn in enumerate(turns):
        if n:
            sent.append(list(state.messages))
        step = state.step(turn)
        results = [run_tool(TOOLS, c) for c in step.calls]
        state = advance(state, turn, StreamTiming(started=float(n), first_output=n + 0.25),
                        step, results)
        if state.result is not None:
            break
    return state, sent


def test_run_state_across_three_turns() -> None:
    state = start_run("count words", {"max_tokens": 32, "temperature": 0.5}, {"temperature": 0.0},
                      first_tool_choice="required", tool_choice=None, max_turns=5)
    assert state.messages == "count words"
    assert state.options == {"max_tokens": 32, "temperature": 0.0, "tool_choice": "required"}
    assert state.later_options == {"max_tokens": 32, "temperature": 0.0}
    t1 = make_turn("a1", tool_calls=[call("c1", "word_count", text="one two three"),
                                     call("c2", "grep", pattern="x")], usage=(30, 0, 30, 12))
    t2 = make_turn("a2", tool_calls=[call("c3", "fail", reason="disk full")])
    t3 = make_turn("a3", content="Three words.", usage=(90, 84, 6, 4))
    state, sent = drive(state, [t1, t2, t3])
    assert sent[0] == [
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "tool", "tool_call_id": "c2",
         "content": "Error: unknown tool 'grep'; the available tools are: fail, word_count"}]
    assert sent[1] == [{"role": "tool", "tool_call_id": "c3",
                        "content": "Error: fail raised RuntimeError: disk full"}]
    assert state.options == state.later_options  # tool_choice was for the first turn only
    result = state.result
    assert result is not None and result.stop_reason == "answered"
    assert result.final_turn is t3 and result.text == "Three words."
    assert [r.turn_id for r in result.turns] == ["a1", "a2", "a3"]
    assert [[x.call.id for x in r.tool_results] for r in result.turns] == [["c1", "c2"], ["c3"],
                                                                           []]
    assert [x.is_error for x in result.turns[0].tool_results] == [False, True]
    first, last = result.turns[0], result.turns[2]
    assert (first.cached_tokens, first.computed_tokens, first.output_tokens) == (0, 30, 12)
    assert (last.input_tokens, last.cached_tokens, last.computed_tokens) == (90, 84, 6)
    assert all(r.ttft_s == 0.25 for r in result.turns)


def test_run_state_follows_a_tool_choice_per_turn() -> None:
    plan = [{"name": "word_count"}, "required", None]
    state = start_run("go", {"max_tokens": 8}, {}, first_tool_choice=plan, tool_choice="none",
                      max_turns=5)
    asking = [make_turn(f"a{k}", tool_calls=[call(f"c{k}", "word_count", text="x")])
              for k in range(4)]
    sent_options = [state.options]
    for turn in [*asking, make_turn("a4", content="done")]:
        step = state.step(turn)
        results = [run_tool(TOOLS, c, lambda: 0.0) for c in step.calls]
        state = advance(state, turn, StreamTiming(started=0.0), step, results)
        sent_options.append(state.options)
    # turn 1 and 2 follow the plan, turn 3 (None in the plan) and later turns use the loop's
    assert [o["tool_choice"] for o in sent_options[:5]] == [
        {"name": "word_count"}, "required", "none", "none", "none"]
    assert all(o["max_tokens"] == 8 for o in sent_options)
    assert state.result is not None and state.result.stop_reason == "answered"
    assert len(state.result.turns) == 5
    # one choice (a str or a mapping) is for the first turn only, as before
    for one in ("required", {"name": "word_count"}):
        single = start_run("go", {}, {}, first_tool_choice=one, tool_choice=None, max_turns=2)
        assert single.options == {"tool_choice": one} and single.planned == ()
    assert start_run("go", {}, {}, first_tool_choice=[], tool_choice="auto",
                     max_turns=2).options == {"tool_choice": "auto"}


def test_run_state_stops_at_max_turns_without_running_the_last_calls() -> None:
    state = start_run([{"role": "user", "content": "go"}], {}, {}, first_tool_choice=None,
                      tool_choice="auto", max_turns=2)
    assert state.options == state.later_options == {"tool_choice": "auto"}
    asking = [make_turn(f"a{k}", tool_calls=[call(f"c{k}", "word_count", text="x")])
              for k in range(3)]
    state, sent = drive(state, asking)
    assert state.result is not None and state.result.stop_reason == "max_turns"
    assert [r.turn_id for r in state.result.turns] == ["a0", "a1"]
    assert state.result.turns[-1].tool_results == ()
    assert len(sent) == 1


def test_retry_plan() -> None:
    user = make_turn("u2", role="user", parent_id="a1",
                     messages=[{"role": "user", "content": "again"}])
    answer = make_turn("a2", parent_id="u2", content="bad")
    tool_turn = make_turn("t2", role="tool", parent_id="a1",
                          messages=[{"role": "tool", "tool_call_id": "c1", "content": "3"}])
    assert retry_plan(answer, user) == ("a1", [{"role": "user", "content": "again"}])
    assert retry_plan(user, None) == ("a1", [{"role": "user", "content": "again"}])
    assert retry_plan(tool_turn, None) == ("a1", tool_turn.messages)
    root = make_turn("r0", role="root", parent_id=None)
    with pytest.raises(ValueError):
        retry_plan(root, None)
    with pytest.raises(ValueError):
        retry_plan(answer, None)


def test_observe_and_record() -> None:
    final = make_turn("a1", content="hi")
    events: list[tuple[Any, float]] = [
        (TurnStart(type="turn_start", input_turn_id="u1"), 1.1),
        (TextDelta(type="text_delta", text="h"), 1.4),
        (TextDelta(type="text_delta", text="i"), 1.5),
        (TurnEnd(type="turn_end", turn=final, timings={"ttft_s": 0.2}), 1.6)]
    timing = StreamTiming(started=1.0)
    for event, now in events:
        timing = observe(timing, event, now)
    record = make_record(final, timing)
    assert record.ttft_s == pytest.approx(0.4) and record.timings == {"ttft_s": 0.2}
    silent = observe(observe(StreamTiming(started=0.0), events[0][0], 0.1), events[3][0], 0.7)
    assert make_record(final, silent).ttft_s == pytest.approx(0.7)  # nothing streamed: its end
    assert make_record(final, StreamTiming(started=0.0)).ttft_s is None


def test_turn_table() -> None:
    records = [make_record(make_turn("a1", usage=(30, 0, 30, 12)),
                           StreamTiming(0.0, 0.1234), [run_tool(TOOLS, ToolCall("c", "fail", {
                               "reason": "x"}))]),
               make_record(make_turn("a2", usage=None, branch=None), StreamTiming(0.0))]
    assert sdk.turn_table(records).splitlines() == [
        "turn  branch  cached  computed  output  ttft_ms  tools",
        "   1  main         0        30      12      123  fail!",
        "   2  -            0         0       0        -  -"]


def test_turn_attributes() -> None:
    assert turn_attributes(make_turn("a1", usage=(40, 32, 8, 6))) == {
        "radixgate.turn.id": "a1", "radixgate.turn.finish_reason": "stop",
        "gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 6,
        "gen_ai.usage.cache_read.input_tokens": 32}


def test_tool_table_rules() -> None:
    assert sorted(TOOLS) == ["fail", "word_count"]
    with pytest.raises(ValueError):
        tool_table([word_count, sdk.tool(fail, name="word_count")], allow_async=True)
    with pytest.raises(TypeError):
        tool_table([async_tool], allow_async=False)
    assert tool_table([async_tool], allow_async=True)["async_tool"].is_async


def test_best_of_branch_names() -> None:
    names = best_of_branches("main", 4)
    assert len(set(names)) == 4 and all(is_valid_branch(n) for n in names)
    assert best_of_branches("dev", 2, "ab12") == ["dev.best0-ab12", "dev.best1-ab12"]


def test_loop_construction() -> None:
    with sdk.Client("http://gw", http_client=httpx.Client()) as client:
        session = sdk.Session(client, "s1", "main", "r0", 1)
        loop = sdk.AgentLoop(session, [word_count], max_turns=3, generate={"max_tokens": 8})
        assert (loop.branch, loop.head_turn_id, sorted(loop.tools)) == ("main", "r0",
                                                                        ["word_count"])
        assert sdk.AgentLoop(session, branch="dev").head_turn_id is None
        with pytest.raises(TypeError):
            sdk.AgentLoop(session, [async_tool])
        with pytest.raises(ValueError):
            sdk.AgentLoop(session, max_turns=0)
    async_session = sdk.AsyncSession(sdk.AsyncClient("http://gw"), "s1", "main", "r0", 1)
    assert "async_tool" in sdk.AsyncAgentLoop(async_session, [async_tool, word_count]).tools
