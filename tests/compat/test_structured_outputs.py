"""Structured output through the official `openai` and `anthropic` clients against a live
gateway on the tiny random model: `response_format` (json_schema strict, json_object, and
`chat.completions.parse` with a pydantic model), Anthropic's `output_config.format` (and
`messages.parse`), and the 400s that leave nothing in the store."""

from __future__ import annotations

import json
from typing import Any, Literal

import anthropic
import jsonschema
import openai
import pytest
import redis
from pydantic import BaseModel

from tests.compat.conftest import WEATHER_TOOL, Live
from tests.output_schemas import INVALID_SCHEMA, ORDER, PERSON, TAGS, UNSUPPORTED
from tests.output_schemas import json_schema_format as schema_format


class Shipping(BaseModel):
    method: Literal["ground", "air"]
    express: bool


class Parcel(BaseModel):
    """Bounded without length keywords (the anthropic client moves those into descriptions)."""

    sku: Literal["A1", "B2", "C3"]
    shipping: Shipping
    colours: list[Literal["red", "green", "blue"]]
    gift: bool | None


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("schema", [ORDER, TAGS], ids=["order", "tags"])
def test_openai_json_schema_answers_validate(live: Live, schema: dict[str, Any]) -> None:
    completion = live.openai().chat.completions.create(
        model="gpt-4o", messages=user("Fill it in."), max_tokens=300, temperature=1.0, seed=4,
        response_format=schema_format("answer", schema))  # type: ignore[arg-type]
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    jsonschema.validate(json.loads(choice.message.content or ""), schema)


def test_openai_parse_with_a_pydantic_model_streamed_and_not(live: Live) -> None:
    client = live.openai()
    completion = client.chat.completions.parse(
        model="gpt-4o", messages=user("A parcel, please."), max_tokens=200, temperature=0,
        response_format=Parcel)
    message = completion.choices[0].message
    assert isinstance(message.parsed, Parcel) and completion.choices[0].finish_reason == "stop"
    with client.chat.completions.stream(
            model="gpt-4o", messages=user("Another parcel."), max_tokens=200, temperature=1.0,
            seed=2, response_format=Parcel) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Parcel)


def test_openai_json_object_is_an_object(live: Live) -> None:
    completion = live.openai().chat.completions.create(
        model="gpt-4o", messages=user("Reply in JSON."), max_tokens=48, temperature=0,
        response_format={"type": "json_object"})
    choice = completion.choices[0]
    content = choice.message.content or ""
    assert content.startswith("{"), content
    if choice.finish_reason == "stop":  # the random model may not close it in 48 tokens
        assert isinstance(json.loads(content), dict)


def test_openai_tools_with_a_schema_give_calls_or_the_answer(live: Live) -> None:
    client = live.openai()
    for seed in range(3):
        completion = client.chat.completions.create(
            model="gpt-4o", messages=user("Weather or person?"), max_tokens=300,
            temperature=1.0, seed=seed, tools=[WEATHER_TOOL],  # type: ignore[list-item]
            response_format=schema_format("person", PERSON))  # type: ignore[arg-type]
        message = completion.choices[0].message
        if message.tool_calls:
            assert completion.choices[0].finish_reason == "tool_calls" and not message.content
        else:
            jsonschema.validate(json.loads(message.content or ""), PERSON)


def test_anthropic_output_config_and_parse(live: Live) -> None:
    client = live.anthropic()
    message = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=300, messages=user("An order."),
        output_config={"format": {"type": "json_schema", "schema": ORDER}})
    assert message.stop_reason == "end_turn"
    (block,) = message.content
    assert block.type == "text"
    jsonschema.validate(json.loads(block.text), ORDER)
    parsed = client.messages.parse(model="claude-sonnet-4-5", max_tokens=200,
                                   messages=user("A parcel."), output_format=Parcel)
    assert isinstance(parsed.parsed_output, Parcel)
    beta = client.post("/v1/messages", cast_to=object, body={  # the beta's top-level field
        "model": "claude-sonnet-4-5", "max_tokens": 300, "messages": user("A person."),
        "output_format": {"type": "json_schema", "schema": PERSON}})
    assert isinstance(beta, dict)
    jsonschema.validate(json.loads(beta["content"][0]["text"]), PERSON)


def store_keys(live: Live) -> set[bytes]:
    client = redis.Redis.from_url(live.redis_url)
    try:
        return set(client.scan_iter(match=f"{live.key_prefix}*", count=1000))
    finally:
        client.close()


BAD_FORMATS: list[tuple[dict[str, Any], str, str]] = [
    *[(schema_format("x", schema), "response_format", word)
      for schema, word in UNSUPPORTED.values()],
    (schema_format("x", INVALID_SCHEMA), "response_format", "invalid JSON Schema"),
    ({"type": "yaml"}, "response_format.type", "'yaml'"),
]


def test_bad_formats_are_400s_that_write_nothing(live: Live) -> None:
    client = live.openai()
    before = store_keys(live)
    for i, (fmt, param, words) in enumerate(BAD_FORMATS):
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(
                model="gpt-4o", messages=user(f"A fresh conversation {i}."), max_tokens=8,
                response_format=fmt)  # type: ignore[arg-type]
        body = bad.value.body
        assert isinstance(body, dict) and body["param"] == param, body
        assert body["type"] == "invalid_request_error" and words in body["message"], body
    for i, (fmt, _, words) in enumerate(BAD_FORMATS[:-1]):  # in Anthropic's envelope
        with pytest.raises(anthropic.BadRequestError) as refused:
            live.anthropic().messages.create(
                model="claude-sonnet-4-5", max_tokens=8, messages=user(f"Fresh {i}."),
                output_config={"format": {"type": "json_schema",
                                          "schema": fmt["json_schema"]["schema"]}})
        error = refused.value.body["error"]  # type: ignore[index]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("output_config.format") and words in error["message"]
    assert store_keys(live) == before  # no session, turn, index entry or lease
