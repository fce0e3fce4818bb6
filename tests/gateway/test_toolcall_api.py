"""Tool calls through the session API (tiny random model, real engine and Redis): streamed
events, the stored assistant turn, tool results appended back, and the 4xx answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema

from tests.gateway.conftest import Harness
from tests.gateway.test_turns import parse_sse
from tests.toolcall_tools import TOOLS, schema_of


async def create(h: Harness, tools: list[dict[str, Any]]) -> str:
    r = await h.client.post("/v1/sessions", json={"system": "Use tools.", "tools": tools})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_streamed_calls_match_the_stored_turn(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = await create(h, TOOLS)
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "Plan my day"}],
            "generate": {"max_tokens": 400, "temperature": 1.0, "seed": 3, "stream": True,
                         "tool_choice": "required"}})
        assert r.status_code == 200, r.text
        frames = parse_sse(r.text)
        kinds = [e for _, e, _ in frames]
        assert kinds[0] == "turn_start" and kinds[-1] == "turn_end"
        assert kinds[1] == "tool_call_start" and "text_delta" not in kinds
        turn = frames[-1][2]["turn"]
        assert isinstance(turn, dict)
        assert turn["finish_reason"] == "tool_calls" and turn["content"] == ""
        starts = [d for _, e, d in frames if e == "tool_call_start"]
        ends = [d for _, e, d in frames if e == "tool_call_end"]
        assert len(starts) == len(ends) == len(turn["tool_calls"]) >= 1
        for start, end, call in zip(starts, ends, turn["tool_calls"], strict=True):
            fragments = "".join(str(d["arguments"]) for _, e, d in frames
                                if e == "tool_call_delta" and d["index"] == start["index"])
            assert json.loads(fragments) == end["arguments"] == call["arguments"]
            assert start["id"] == end["id"] == call["id"] and call["id"].startswith("call_")
            assert start["name"] == call["name"]
            jsonschema.validate(call["arguments"], schema_of(call["name"]))
        stored = (await h.client.get(f"/v1/sessions/{sid}/turns/{turn['id']}")).json()
        assert stored["tool_calls"] == turn["tool_calls"]
        assert stored["messages"][0]["tool_calls"] == turn["tool_calls"]

        # The tool results go back as role "tool" messages; the next turn is a named call.
        results = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                   for c in turn["tool_calls"]]
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": results,
            "generate": {"max_tokens": 400, "tool_choice": {"name": "set_flags"}}})
        assert r.status_code == 200, r.text
        second = r.json()
        assert second["finish_reason"] == "tool_calls"
        assert [c["name"] for c in second["tool_calls"]] == ["set_flags"]
        jsonschema.validate(second["tool_calls"][0]["arguments"], schema_of("set_flags"))
        tree = (await h.client.get(f"/v1/sessions/{sid}")).json()["turns"]
        assert [t["role"] for t in tree] == ["root", "user", "assistant", "tool", "assistant"]

    run_gateway(body)


def test_none_and_tool_free_sessions_give_text(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        for tools, choice in ((TOOLS, "none"), ([], None)):
            sid = await create(h, tools)
            r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
                "messages": [{"role": "user", "content": "hi"}],
                "generate": {"max_tokens": 6, "tool_choice": choice}})
            assert r.status_code == 200, r.text
            turn = r.json()
            assert turn["tool_calls"] == [] and turn["finish_reason"] in ("stop", "length")
            assert "<tool_call>" not in turn["content"]

    run_gateway(body)


def test_bad_tools_and_choices_are_4xx(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        bad = {"type": "function", "function": {"name": "t", "parameters": {
            "type": "object", "properties": {"a": {"type": "strang"}}}}}
        r = await h.client.post("/v1/sessions", json={"tools": [bad]})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_tool_schema"
        assert "properties/a/type" in r.json()["error"]["message"]
        # Valid JSON schema, but not one the grammar compiles: the engine's error, also a 400.
        odd = {"name": "t", "input_schema": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 5, "maximum": 1}}}}
        sid = await create(h, [odd])
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "x"}], "generate": {"max_tokens": 4}})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_tool_schema"
        sid = await create(h, TOOLS)
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "x"}],
            "generate": {"tool_choice": {"name": "nope"}}})
        assert r.status_code == 400 and "nope" in r.json()["error"]["message"]
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "x"}],
            "generate": {"tool_choice": "sometimes"}})
        assert r.status_code == 422
        sid = await create(h, [])
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "x"}],
            "generate": {"tool_choice": "required"}})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request"
        tree = (await h.client.get(f"/v1/sessions/{sid}")).json()["turns"]
        assert len(tree) == 1  # rejected before any turn was written

    run_gateway(body)
