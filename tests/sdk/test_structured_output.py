"""Structured output in the SDK: `generate.response_format`, and the agent loop's `output_type`
(a pydantic model class or a JSON-schema dict) sent with every turn and parsed into
`AgentResult.output`; unit rules, then both twins against a live gateway (tiny random model)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

import sdk
from sdk._agent import Step, StreamTiming, advance, start_run
from sdk._output import OutputType
from sdk.types import Turn
from tests.output_schemas import PERSON
from tests.sdk.test_agent_live import loop_type, pick
from tests.sdk.test_client_unit import call
from tests.sdk.test_live import TWINS, client_for


class Box(BaseModel):
    colour: Literal["red", "green", "blue"]
    count: Annotated[int, Field(ge=0, le=9)]
    fragile: bool


class Shipment(BaseModel):
    box: Box
    labels: Annotated[list[Literal["up", "dry"]], Field(max_length=3)]


def turn(content: str, tool_calls: list[dict[str, Any]] | None = None) -> Turn:
    return Turn(id="t", session_id="s", parent_id="p", role="assistant", depth=2, version=1,
                created_ms=0, num_tokens=3, content=content, tool_calls=tool_calls or [],
                finish_reason="stop")


def test_output_types_become_strict_json_schema_formats() -> None:
    model = OutputType.of(Shipment)
    assert model.response_format == {"type": "json_schema", "json_schema": {
        "name": "Shipment", "schema": Shipment.model_json_schema(), "strict": True}}
    plain = OutputType.of({**PERSON, "title": "a person!"})
    assert plain.response_format["json_schema"]["name"] == "a_person_" and plain.model is None
    with pytest.raises(TypeError):
        OutputType.of(str)  # type: ignore[arg-type]
    good = '{"box": {"colour": "red", "count": 2, "fragile": true}, "labels": ["up"]}'
    assert model.parse(good) == Shipment.model_validate_json(good)
    assert plain.parse('{"a": 1}') == {"a": 1}
    for bad_type, text in ((model, '{"box": {}}'), (model, '{"box'), (plain, "{")):
        with pytest.raises(sdk.OutputError) as caught:
            bad_type.parse(text)
        assert isinstance(caught.value, ValueError | sdk.RadixgateError)
        assert caught.value.text == text


def test_every_turn_of_a_run_asks_for_the_format_and_the_answer_is_parsed() -> None:
    output = OutputType.of(Shipment)
    state = start_run("go", {"max_tokens": 9}, {}, first_tool_choice={"name": "pick"},
                      tool_choice="none", max_turns=3, output_type=output)
    assert state.options["response_format"] == output.response_format
    assert state.later_options["response_format"] == output.response_format
    assert state.options["tool_choice"] == {"name": "pick"}
    overridden = start_run("go", {}, {"response_format": {"type": "json_object"}},
                           first_tool_choice=None, tool_choice=None, max_turns=3,
                           output_type=output)
    assert overridden.options["response_format"] == {"type": "json_object"}
    answer = '{"box": {"colour": "blue", "count": 0, "fragile": false}, "labels": []}'
    done = advance(state, turn(answer), StreamTiming(0.0), Step(stop_reason="answered"), [])
    assert done.result is not None and done.result.output == Shipment.model_validate_json(answer)
    stopped = advance(state, turn("", [{"id": "c", "name": "pick", "arguments": {}}]),
                      StreamTiming(0.0), Step(stop_reason="max_turns"), [])
    assert stopped.result is not None and stopped.result.output is None
    plain = start_run("go", {}, {}, first_tool_choice=None, tool_choice=None, max_turns=1)
    assert "response_format" not in plain.options
    assert advance(plain, turn("hi"), StreamTiming(0.0), Step(stop_reason="answered"),
                   []).result.output is None  # type: ignore[union-attr]


@TWINS
def test_loop_output_type_after_a_tool_turn(sync: bool, live_server: str) -> None:
    async def body() -> Any:
        client = client_for(sync, live_server)
        loop = await call(loop_type(sync).create(
            client, [pick], system="Structured output test.", tool_choice="none",
            max_turns=3, generate={"max_tokens": 200}, output_type=Shipment))
        result = await call(loop.run("Pick, then describe the shipment.",
                                     tool_choice={"name": "pick"}))
        await call(client.close())
        return result

    result = asyncio.run(body())
    assert result.stop_reason == "answered" and len(result.turns) == 2
    assert result.turns[0].turn.tool_calls  # the forced call (no schema: calls only)
    assert isinstance(result.output, Shipment)
    assert result.output == Shipment.model_validate_json(result.text)


@TWINS
def test_a_schema_dict_and_plain_generate_option(sync: bool, live_server: str) -> None:
    async def body() -> tuple[Any, Any]:
        client = client_for(sync, live_server)
        loop = await call(loop_type(sync).create(client, system="JSON dict test.",
                                                 generate={"max_tokens": 200},
                                                 output_type=PERSON))
        result = await call(loop.run("Who?"))
        session = await call(client.sessions.create(system="Plain option test."))
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        appended = await call(session.append("Who?", max_tokens=200, response_format=fmt))
        await call(client.close())
        return result, appended

    result, appended = asyncio.run(body())
    jsonschema.validate(result.output, PERSON)
    assert result.output == json.loads(result.text)
    assert appended.finish_reason == "stop"
    jsonschema.validate(json.loads(appended.content or ""), PERSON)
