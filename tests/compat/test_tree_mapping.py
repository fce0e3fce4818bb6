"""Stateless requests land on the session tree: a conversation resent turn after turn grows one
branch and computes only its delta; an edited earlier message forks; `X-Claude-Code-Session-Id`
names the session; tenants never share one. Tiny random model, official clients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.compat.conftest import PAGE_SIZE, WEATHER_TOOL, Live

NAMED_OPENAI = {"type": "function", "function": {"name": "get_weather"}}
TOOL_ANTHROPIC = {"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}
GREEDY = {"temperature": 0}
HINT = "x-claude-code-session-id"
Usage = dict[str, int]  # prompt (all prompt tokens), output, cached
Turn = Callable[[Live, list[dict[str, Any]]], tuple[str, Usage]]


def openai_tool_turn(live: Live, messages: list[dict[str, Any]]) -> tuple[str, Usage]:
    """One tool-calling turn; appends the reply and its tool results to `messages`."""
    raw = live.openai().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, max_tokens=128, tools=[WEATHER_TOOL],
        tool_choice=NAMED_OPENAI, temperature=0)
    completion = raw.parse()
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "tool_calls" and message.tool_calls
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    messages.append(message.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "21 C"}
                 for c in message.tool_calls]
    return raw.headers["x-radixgate-session-id"], {
        "prompt": completion.usage.prompt_tokens, "output": completion.usage.completion_tokens,
        "cached": completion.usage.prompt_tokens_details.cached_tokens or 0}


def anthropic_tool_turn(live: Live, messages: list[dict[str, Any]]) -> tuple[str, Usage]:
    raw = live.anthropic().messages.with_raw_response.create(
        model="claude-sonnet-4-6", max_tokens=128, messages=messages,
        tools=[TOOL_ANTHROPIC], tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY)
    message = raw.parse()
    assert message.stop_reason == "tool_use"
    messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": b.id, "content": "21 C"}
        for b in message.content if b.type == "tool_use"]})
    cached = message.usage.cache_read_input_tokens or 0
    return raw.headers["x-radixgate-session-id"], {
        "prompt": message.usage.input_tokens + cached, "output": message.usage.output_tokens,
        "cached": cached}


def text_turn(live: Live, messages: list[dict[str, Any]], **headers: str
              ) -> tuple[str, Usage, str]:
    """One plain OpenAI turn (no echo appended); (session id, usage, reply text)."""
    raw = live.openai().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, max_tokens=5, temperature=0,
        extra_headers=headers)
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    return raw.headers["x-radixgate-session-id"], {
        "prompt": completion.usage.prompt_tokens, "output": completion.usage.completion_tokens,
        "cached": completion.usage.prompt_tokens_details.cached_tokens or 0,
    }, completion.choices[0].message.content or ""


@pytest.mark.parametrize("turn", [openai_tool_turn, anthropic_tool_turn],
                         ids=["openai", "anthropic"])
def test_five_tool_turns_grow_one_branch_and_reuse_the_whole_context(live: Live,
                                                                     turn: Turn) -> None:
    task = f"Plan a trip ({turn.__name__})."
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    if turn is openai_tool_turn:
        messages.insert(0, {"role": "system", "content": "Use the tools."})
    session_ids, usages = zip(*(turn(live, messages) for _ in range(5)), strict=True)
    assert len(set(session_ids)) == 1
    for previous, usage in zip(usages, usages[1:], strict=False):
        context = previous["prompt"] + previous["output"]
        # Everything the previous turn saw and said is cached, but its partial last page.
        assert context - PAGE_SIZE <= usage["cached"] <= context + 1, (previous, usage)
        assert usage["prompt"] - usage["cached"] < 3 * PAGE_SIZE  # the delta, not the history
    state = live.session(session_ids[0])
    roles = [t["role"] for t in state["turns"]]
    assert roles == ["root", "user", "assistant"] + ["tool", "assistant"] * 4
    assert list(state["branches"]) == ["main"] and state["branches"]["main"] == \
        state["turns"][-1]["id"]


def test_an_edited_earlier_message_forks_at_the_last_matching_turn(live: Live) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Fork test."},
                                      {"role": "user", "content": "first question"}]
    usages = []
    for question in ("second question", "third question"):
        session_id, usage, reply = text_turn(live, messages)
        usages.append(usage)
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": question}]
    session_id, last, _ = text_turn(live, messages)
    before = live.session(session_id)
    turn_one = before["turns"][2]["id"]  # root, user, assistant: the first reply

    edited = [*messages[:3], {"role": "user", "content": "an EDITED second question"},
              *messages[4:]]
    fork_session, usage, _ = text_turn(live, edited)
    assert fork_session == session_id
    after = live.session(session_id)
    assert after["branches"]["main"] == before["branches"]["main"]  # the old line is untouched
    (fork_branch,) = set(after["branches"]) - {"main"}
    new = [t for t in after["turns"] if t["id"] not in {u["id"] for u in before["turns"]}]
    assert [t["role"] for t in new] == ["user", "assistant"]
    assert new[0]["parent_id"] == turn_one and after["branches"][fork_branch] == new[1]["id"]
    # The first exchange is reused; the edited message and what follows are computed.
    first_context = usages[0]["prompt"] + usages[0]["output"]
    assert first_context - PAGE_SIZE <= usage["cached"] < last["cached"]
    assert usage["prompt"] - usage["cached"] > PAGE_SIZE


def test_trimmed_assistant_text_still_matches(live: Live) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "trim test"}]
    session_id, first, reply = text_turn(live, messages)
    messages += [{"role": "assistant", "content": f"  {reply.strip()}\n"},
                 {"role": "user", "content": "next"}]
    again, usage, _ = text_turn(live, messages)
    assert again == session_id
    assert usage["cached"] >= first["prompt"] + first["output"] - PAGE_SIZE


def test_session_header_names_the_session(live: Live) -> None:
    messages = [{"role": "user", "content": "same first message"}]
    a, _, reply_a = text_turn(live, messages, **{HINT: "claude-session-a"})
    b, _, _ = text_turn(live, messages, **{HINT: "claude-session-b"})
    assert a != b  # same content, different agent sessions
    again, _, _ = text_turn(live, messages, **{HINT: "claude-session-a"})
    assert again == a  # a retried first message: the same session, a branch from the root
    state = live.session(a)
    assert len(state["branches"]) == 2
    assert {t["parent_id"] for t in state["turns"] if t["role"] == "user"} == {
        state["root_turn_id"]}
    follow = [*messages, {"role": "assistant", "content": reply_a},
              {"role": "user", "content": "go on"}]
    cont, usage, _ = text_turn(live, follow, **{HINT: "claude-session-a"})
    assert cont == a and usage["cached"] > 0
    odd, _, _ = text_turn(live, messages, **{HINT: "an odd/hint with spaces"})
    assert odd not in (a, b)  # any header value works; it is hashed into the session id


def test_tenants_never_share_a_session(live: Live) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "tenant test"}]
    mine, _, reply = text_turn(live, messages)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
    raw = live.openai(live.other_key).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, max_tokens=3)
    theirs = raw.headers["x-radixgate-session-id"]
    assert theirs != mine
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0  # other namespace in the engine too
