"""Request shapes real agents send, through the official clients: mini-swe-agent's
`parallel_tool_calls=false` with `tool_choice="required"`, Anthropic's
`disable_parallel_tool_use`, and the system-role message Claude Code puts in `messages`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway.compat import anthropic_mapping
from gateway.compat.anthropic_schemas import MessagesRequest
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


def _claude_code_first_request() -> dict[str, Any]:
    """Claude Code 2.1's first request in `-p --bare` mode (trimmed: one tool fewer, no
    metadata): its system blocks, the empty system-role placeholder after the prompt, and the
    fields of its betas that the gateway ignores."""
    return {"model": "claude-opus-5-5", "max_tokens": 8, "stream": False,
            "system": [{"type": "text", "text": "You are a coding assistant. Be brief.",
                        "cache_control": {"type": "ephemeral"}}],
            "tools": [CLAUDE_TOOL],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Read calc.py.", "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": []}],
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                              "keep": "all"}]},
            "output_config": {"effort": "medium"}, "temperature": 0}


def test_an_empty_system_role_message_maps_to_nothing() -> None:
    # Claude Code drops the placeholder once rejected: both shapes must land on the same path.
    body = _claude_code_first_request()
    without = {**body, "messages": body["messages"][:1]}
    assert anthropic_mapping.conversation_of(MessagesRequest.model_validate(body)) == \
        anthropic_mapping.conversation_of(MessagesRequest.model_validate(without))


def test_claude_code_first_request_is_answered(live: Live) -> None:
    with live.http() as http:
        r = http.post("/v1/messages", json=_claude_code_first_request(), headers={
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,context-management-2025-06-27,"
                              "per-turn-control-2026-07-01,effort-2025-11-24"})
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message"


def test_claude_code_billing_line_is_not_rendered() -> None:
    """It changes with every conversation: kept, two Claude Code conversations with one system
    prompt would share no prefix."""
    def system_of(suffix: str) -> str | None:
        body = {**_claude_code_first_request(), "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.332.{suffix}; "
                                     "cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are a Claude agent."},
            {"type": "text", "text": "You are a coding assistant. Be brief."}]}
        return anthropic_mapping.conversation_of(MessagesRequest.model_validate(body)).system

    assert system_of("930") == system_of("bf1") == (
        "You are a Claude agent.\nYou are a coding assistant. Be brief.")


def test_two_concurrent_stateless_requests_on_one_conversation(live: Live) -> None:
    """Both succeed: the second finds the branch busy (or moved) and forks its own."""
    client = live.openai()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Start a story."}]
    first = client.chat.completions.create(model="gpt-4o", max_tokens=4, temperature=0,
                                           messages=messages)
    assert first.choices[0].message.content is not None
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Go on."}]
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda _: client.chat.completions.with_raw_response.create(
            model="gpt-4o", max_tokens=24, temperature=0, messages=messages), range(2)))
    session_ids = {r.headers["x-radixgate-session-id"] for r in replies}
    assert len(session_ids) == 1
    view = live.session(session_ids.pop())  # checks the tree's invariants too
    branches = view["branches"]
    assert len(branches) == 2, branches
    reply_ids = {r.headers["x-radixgate-turn-id"] for r in replies}
    assert reply_ids == set(branches.values())
