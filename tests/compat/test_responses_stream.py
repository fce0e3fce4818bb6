"""`/v1/responses` as a stream (raw event order and ids, the SDK's accumulator, replay from the
store), background responses and cancel, `text.format` structured output, and failures: a
context overflow and a store outage at save time."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.compat.responses_store import ResponseStore, StoredResponse
from tests.compat.conftest import Live
from tests.compat.test_responses import FLAT_WEATHER


def sse_events(live: Live, body: dict[str, Any], path: str = "/v1/responses",
               method: str = "POST") -> list[dict[str, Any]]:
    """The SSE events of a request, parsed from the raw stream (the `event:` line must name the
    JSON's `type`)."""
    events: list[dict[str, Any]] = []
    with httpx.Client(base_url=live.base_url, timeout=120,
                      headers={"Authorization": f"Bearer {live.key}"}) as http:
        with http.stream(method, path, json=body if method == "POST" else None) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/event-stream")
            kind = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    event = json.loads(line.removeprefix("data: "))
                    assert event["type"] == kind
                    events.append(event)
    return events


def test_stream_event_order_and_ids(live: Live) -> None:
    events = sse_events(live, {"model": "gpt-4.1-mini", "input": "Weather in Oslo?",
                            "tools": [FLAT_WEATHER], "tool_choice": "required",
                            "parallel_tool_calls": False, "stream": True,
                            "max_output_tokens": 64, "temperature": 0})
    kinds = [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert kinds[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done",
                          "response.output_item.done", "response.completed"]
    assert "response.function_call_arguments.delta" in kinds
    added, done, final = events[2]["item"], events[-2]["item"], events[-1]["response"]
    assert added["type"] == "function_call" and added["arguments"] == ""
    assert final["output"] == [done] and done["id"] == added["id"]
    deltas = "".join(e["delta"] for e in events
                     if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(deltas) == json.loads(done["arguments"])
    # Replayed from the store: the same items, the same event types.
    replay = sse_events(live, {}, f"/v1/responses/{final['id']}?stream=true", "GET")
    assert [e["type"] for e in replay] == kinds[:2] + [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert replay[-1]["response"] == final
    later = sse_events(live, {}, f"/v1/responses/{final['id']}?stream=true&starting_after=3",
                    "GET")
    assert [e["sequence_number"] for e in later] == list(range(4, len(replay)))


def test_sdk_stream_accumulator(live: Live) -> None:
    client = live.openai()
    with client.responses.stream(model="gpt-4.1-mini", input="Weather in Rome?",
                                 tools=[FLAT_WEATHER], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=64,
                                 temperature=0) as stream:
        final = stream.get_final_response()
    [call] = final.output
    assert call.type == "function_call" and json.loads(call.arguments)["city"] in (
        "Paris", "Rome", "Oslo")
    assert client.responses.retrieve(final.id).output[0].id == call.id
    # Text cut by max_output_tokens ends with `response.incomplete`, as OpenAI's does.
    with client.responses.stream(model="gpt-4.1-mini", input="tell me more",
                                 max_output_tokens=8, temperature=0) as text_stream:
        events = list(text_stream)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    assert last.response.output_text == deltas
    if last.type == "response.incomplete":
        assert last.response.incomplete_details is not None
        assert last.response.incomplete_details.reason == "max_output_tokens"


def test_background_response_is_cancelled(live: Live) -> None:
    client = live.openai()
    queued = client.responses.create(model="gpt-4.1-mini", input="write a long story",
                                     background=True, max_output_tokens=4000,
                                     temperature=0)
    assert queued.status in ("queued", "in_progress")
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(queued.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):  # nothing to continue from
        client.responses.create(model="gpt-4.1-mini", input="go on",
                                previous_response_id=queued.id)
    done = client.responses.create(model="gpt-4.1-mini", input="short", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(done.id)
    # A background response read as a stream while it runs: its events once it has ended.
    running = client.responses.create(model="gpt-4.1-mini", input="a few words",
                                      background=True, max_output_tokens=24, temperature=0)
    replay = sse_events(live, {}, f"/v1/responses/{running.id}?stream=true", "GET")
    assert replay[0]["type"] == "response.created"
    assert replay[-1]["type"] in ("response.completed", "response.incomplete")
    assert replay[-1]["response"]["usage"]["output_tokens"] >= 1


class Forecast(BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    days: list[Literal["mon", "tue", "wed"]] = Field(max_length=3)
    detail: Detail


class Detail(BaseModel):
    unit: Literal["celsius", "fahrenheit"]
    high: int = Field(ge=-50, le=60)


def test_structured_output_text_format(live: Live) -> None:
    client = live.openai()
    parsed = client.responses.parse(model="gpt-4.1-mini", input="Forecast for Rome",
                                    text_format=Forecast, max_output_tokens=200, temperature=0)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Forecast)
    schema = Forecast.model_json_schema()
    jsonschema.validate(json.loads(parsed.output_text), schema)
    flag = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
            "additionalProperties": False}
    streamed = sse_events(live, {
        "model": "gpt-4.1-mini", "input": "Anything as JSON", "stream": True,
        "text": {"format": {"type": "json_schema", "name": "flag", "schema": flag,
                            "strict": True}}, "max_output_tokens": 50, "temperature": 0})
    assert streamed[-1]["type"] == "response.completed"
    text = streamed[-1]["response"]["output"][0]["content"][0]["text"]
    jsonschema.validate(json.loads(text), flag)
    # json_object: the random model never closes a free object, but what it writes is one.
    loose = client.responses.create(model="gpt-4.1-mini", input="x", max_output_tokens=8,
                                    text={"format": {"type": "json_object"}}, temperature=0)
    assert loose.output_text.lstrip().startswith("{")
    with httpx.Client(base_url=live.base_url, headers={"Authorization": f"Bearer {live.key}"}
                      ) as http:
        r = http.post("/v1/responses", json={
            "model": "gpt-4.1-mini", "input": "x", "text": {"format": {
                "type": "json_schema", "name": "bad", "schema": {
                    "type": "object", "properties": {"a": {"type": "nonsense"}}}}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format"


def test_context_overflow_is_a_400_or_response_failed(live: Live) -> None:
    long_input = "word " * 12000  # past the tiny model's context
    with live.http() as http:
        r = http.post("/v1/responses", json={"model": "gpt-4.1-mini", "input": long_input,
                                             "max_output_tokens": 4})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    events = sse_events(live, {"model": "gpt-4.1-mini", "input": long_input, "stream": True,
                            "max_output_tokens": 4})
    assert [e["type"] for e in events][-1] == "response.failed"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"


def test_store_outage_at_save_is_a_503_or_response_failed(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """The response is generated but cannot be stored: the client is told (503 with
    Retry-After, or `response.failed` with `store_unavailable`), never a 500."""
    async def down(self: ResponseStore, record: StoredResponse) -> None:
        raise RedisConnectionError("store down")

    monkeypatch.setattr(ResponseStore, "save", down)
    with live.http() as http:
        r = http.post("/v1/responses", json={"model": "gpt-4.1-mini", "input": "hi",
                                             "max_output_tokens": 2})
    assert r.status_code == 503 and "Retry-After" in r.headers
    assert r.json()["error"]["code"] == "store_unavailable"
    events = sse_events(live, {"model": "gpt-4.1-mini", "input": "hi", "stream": True,
                            "max_output_tokens": 2})
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "store_unavailable"
