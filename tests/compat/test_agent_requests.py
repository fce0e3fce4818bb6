"""Request shapes real agents send, through the official clients: mini-swe-agent's
`parallel_tool_calls=false` with `tool_choice="required"`, Anthropic's
`disable_parallel_tool_use`, and the system-role message Claude Code puts in `messages`."""

from __future__ import annotations

from typing import Any

from tests.compat.conftest import WEATHER_TOOL, Live

CLAUDE_TOOL: dict[str, Any] = {"name": "get_weather", "description": "Weather of a city",
                               "input_schema": WEATHER_TOOL["function"]["parameters"]}


def test_openai_parallel_tool_calls_false_gives_one_call(live: Live) -> None:
    num_calls = {}
    for parallel in (True, False):
        completion = live.openai().chat.completions.create(
            model="gpt-4o", max_tokens=200, temperature=0, tools=[WEATHER_TOOL],
            tool_choice="required", parallel_tool_calls=parallel,
            messages=[{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}])
        choice = completion.choices[0]
        num_calls[parallel] = len(choice.message.tool_calls or [])
        if not parallel:
            assert choice.finish_reason == "tool_calls"
    assert num_calls[True] > 1 and num_calls[False] == 1  # the flag is what made it one


def test_anthropic_disable_parallel_tool_use_gives_one_block(live: Live) -> None:
    message = live.anthropic().messages.create(
        model="claude-sonnet-4-6", max_tokens=200, tools=[CLAUDE_TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}])
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content if b.type == "tool_use"] == ["tool_use"]


def test_anthropic_system_role_message_is_accepted(live: Live) -> None:
    client = live.anthropic()
    for system in ("", "Answer in French."):  # Claude Code sends an empty one as a placeholder
        message = client.messages.create(
            model="claude-sonnet-4-6", max_tokens=4, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "Hello"},  # type: ignore[list-item,misc]
                      {"role": "system", "content": system},
                      {"role": "user", "content": "Say hi."}])
        assert message.content and message.stop_reason in ("end_turn", "max_tokens")
