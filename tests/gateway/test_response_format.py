"""Structured output in the gateway: `response_format` normalized from every route's shape, the
400s (naming `param`) for what the grammar engine cannot honour, the prompt note, the parser of
"auto" answers, and the native route end to end (tiny random model, real engine and Redis)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from engine.tokenizer import Tokenizer
from gateway.errors import InvalidRequest
from gateway.output_parser import AnswerOrCallsParser, parser_for
from gateway.rendering import TurnRenderer
from gateway.response_format import format_note, normalize_response_format, text_schema
from gateway.tool_prompt import normalize_tools, tool_constraint
from gateway.toolcall_parser import ToolCallParser
from tests.gateway.conftest import Harness
from tests.gateway.test_turns import parse_sse
from tests.output_schemas import (
    INVALID_SCHEMA,
    ORDER,
    PERSON,
    TAGS,
    UNSUPPORTED,
    json_schema_format,
)
from tests.toolcall_tools import TOOLS, schema_of

NATIVE = json_schema_format("person", PERSON)


def test_every_route_shape_normalizes_to_the_native_one() -> None:
    assert normalize_response_format(None, param="p") is None
    assert normalize_response_format({"type": "text"}, param="p") is None
    assert normalize_response_format({"type": "json_object"}, param="p") == {
        "type": "json_object"}
    chat = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                   "strict": True, "description": "A person"}}
    assert normalize_response_format(chat, param="response_format") == {
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                               "strict": True, "description": "A person"}}
    flat = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    assert normalize_response_format(flat, param="text.format") == NATIVE
    anthropic = {"type": "json_schema", "schema": PERSON}  # no name, no strict
    assert normalize_response_format(anthropic, param="output_config.format") == {
        "type": "json_schema", "json_schema": {"name": "response", "schema": PERSON,
                                               "strict": False}}
    assert normalize_response_format(NATIVE, param="p") == NATIVE  # idempotent
    assert text_schema({"type": "json_object"}) == '{"type":"object"}'
    assert json.loads(text_schema(NATIVE) or "") == PERSON
    assert list(json.loads(text_schema(NATIVE) or "")["properties"]) == ["name", "age", "role"]


@pytest.mark.parametrize(("raw", "param", "words"), [
    ({"type": "xml"}, "response_format.type", "'xml'"),
    ({}, "response_format.type", "None"),
    ("json", "response_format", "must be an object"),
    ({"type": "json_schema"}, "response_format.json_schema", "required"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema",
     "required"),
    ({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}},
     "response_format.json_schema.name", "string"),
    (json_schema_format("x", INVALID_SCHEMA), "response_format", "invalid JSON Schema at"),
    (json_schema_format("x", False), "response_format", "matches no value"),
    *[(json_schema_format("x", schema), "response_format", word)
      for schema, word in UNSUPPORTED.values()],
])
def test_bad_formats_are_400s_naming_the_param(raw: Any, param: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        normalize_response_format(raw, param="response_format")
    assert caught.value.param == param and words in str(caught.value), str(caught.value)
    assert str(caught.value).startswith(param)


def test_the_note_follows_the_constraint() -> None:
    tools = normalize_tools(TOOLS)
    fmt = normalize_response_format(NATIVE, param="p")
    schema = text_schema(fmt)
    alone = format_note(fmt, tool_constraint([], None, text_schema=schema))
    assert alone is not None and alone.startswith("Answer with JSON only")
    assert json.dumps(PERSON, separators=(",", ":")) in alone
    auto = format_note(fmt, tool_constraint(tools, "auto", text_schema=schema))
    assert auto is not None and auto.startswith("If you answer without calling a tool")
    assert format_note(fmt, tool_constraint(tools, "required", text_schema=schema)) is None
    assert format_note(None, tool_constraint(tools, "auto")) is None
    obj = {"type": "json_object"}
    assert format_note(obj, tool_constraint([], None, text_schema=text_schema(obj))) == (
        "Answer with a JSON object only, written compactly on one line.")


def test_the_note_ends_the_last_message_of_the_delta_only(tokenizer: Tokenizer) -> None:
    renderer = TurnRenderer(tokenizer)
    messages = [{"role": "user", "content": "Who?"}]
    for after_root in (True, False):
        plain = tokenizer.decode(renderer.input_token_ids(messages, system="S",
                                                          after_root=after_root))
        noted = tokenizer.decode(renderer.input_token_ids(messages, system="S",
                                                          after_root=after_root, note="N!"))
        assert noted == plain.replace("Who?", "Who?\n\nN!", 1)
    blocks = [{"role": "user", "content": [{"type": "text", "text": "Who?"}]}]
    assert tokenizer.decode(renderer.input_token_ids(blocks, system="S", after_root=False,
                                                     note="N!")) == noted


def test_an_answer_is_text_whatever_it_spells() -> None:
    answer = '{"name": "<tool_call>\\n", "age": 1, "role": "user"}'
    parser = AnswerOrCallsParser()
    events = [e for chunk in (answer[:3], answer[3:20], answer[20:]) for e in parser.feed(chunk)]
    events += parser.finish()
    assert parser.text == answer and parser.tool_calls == []
    assert "".join(getattr(e, "text", "") for e in events) == answer
    call = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": '
            '"celsius"}}\n</tool_call>')
    calls = AnswerOrCallsParser()
    calls.feed(call[:1])
    calls.feed(call[1:])
    calls.finish()
    assert calls.text == "" and [c.name for c in calls.tool_calls] == ["get_weather"]
    schema = text_schema(NATIVE)
    assert parser_for(tool_constraint([], None, text_schema=schema)) is None
    assert isinstance(parser_for(tool_constraint(normalize_tools(TOOLS), "auto",
                                                 text_schema=schema)), AnswerOrCallsParser)
    plain = parser_for(tool_constraint(normalize_tools(TOOLS), "auto"))
    assert type(plain) is ToolCallParser


# ---- the native route ------------------------------------------------------------------------


async def create(h: Harness, tools: list[dict[str, Any]]) -> str:
    r = await h.client.post("/v1/sessions", json={"system": "Answer in JSON.", "tools": tools})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_native_turns_answer_in_json(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = await create(h, [])
        for name, schema in (("order", ORDER), ("tags", TAGS)):
            r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
                "messages": [{"role": "user", "content": f"Give me {name}."}],
                "generate": {"max_tokens": 300, "temperature": 1.0, "seed": 1,
                             "response_format": json_schema_format(name, schema)}})
            assert r.status_code == 200, r.text
            turn = r.json()
            assert turn["finish_reason"] == "stop" and turn["tool_calls"] == []
            jsonschema.validate(json.loads(turn["content"]), schema)

        # With tools under "auto", streamed: calls or the JSON answer, nothing else.
        sid = await create(h, TOOLS)
        kinds = set()
        for seed in range(4):
            r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
                "messages": [{"role": "user", "content": "Who is it?"}],
                "generate": {"max_tokens": 400, "temperature": 1.0, "seed": seed,
                             "stream": True, "response_format": NATIVE}})
            assert r.status_code == 200, r.text
            frames = parse_sse(r.text)
            turn = frames[-1][2]["turn"]
            assert isinstance(turn, dict) and turn["finish_reason"] in ("stop", "tool_calls")
            text = "".join(str(d["text"]) for _, e, d in frames if e == "text_delta")
            assert text == turn["content"]
            if turn["tool_calls"]:
                kinds.add("calls")
                assert text == ""
                for call in turn["tool_calls"]:
                    jsonschema.validate(call["arguments"], schema_of(call["name"]))
            else:
                kinds.add("answer")
                jsonschema.validate(json.loads(text), PERSON)
        assert kinds  # (which ones these seeds take is the random model's business)

    run_gateway(body)


def test_native_bad_formats_leave_nothing_behind(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        sid = await create(h, TOOLS)
        before = (await h.client.get(f"/v1/sessions/{sid}")).json()
        bad = [json_schema_format("x", schema) for schema, _ in UNSUPPORTED.values()]
        bad += [json_schema_format("x", INVALID_SCHEMA), {"type": "yaml"}]
        for fmt in bad:
            r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
                "messages": [{"role": "user", "content": "hi"}],
                "generate": {"max_tokens": 8, "response_format": fmt}})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["type"] == "invalid_request"
            assert error["message"].startswith("generate.response_format"), error
        after = (await h.client.get(f"/v1/sessions/{sid}")).json()
        assert after == before  # no turn, no version bump; the branch is free again:
        r = await h.client.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": "hi"}],
            "generate": {"max_tokens": 300, "response_format": {"type": "json_schema",
                                                                "json_schema": {
                                                                    "name": "p",
                                                                    "schema": PERSON}},
                         "tool_choice": "none"}})
        assert r.status_code == 200, r.text
        jsonschema.validate(json.loads(r.json()["content"]), PERSON)

    run_gateway(body)
