"""Structured output on the real SmolLM2-135M through the compatible routes, drafting on (the
engine's default): for schemas with nested objects, enums, arrays, and required and optional
fields, every answer parses, validates, and ends on its own (finish_reason "stop"). Each
schema is asked twice in one conversation, so the second answer is drafted from the first."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from engine.models.loader import LoadedModel
from tests.compat.conftest import Live, live_gateway
from tests.output_schemas import ORDER, SCHEMAS, json_schema_format

pytestmark = pytest.mark.slow

QUESTIONS = {"person": "Describe Ada Lovelace, a 36 year old admin.",
             "order": "Order 2 of A1 and 1 of C3, shipped by air, express.",
             "tags": "Tag this picture of a red and blue flag, score 7, done."}


@pytest.fixture(scope="module")
def real(loaded_model: LoadedModel, redis_url: str) -> Iterator[Live]:
    with live_gateway(loaded_model, redis_url, "smollm2-135m") as gateway:
        yield gateway


def accepted_drafts(live: Live) -> float:
    text = httpx.get(f"{live.base_url}/metrics", timeout=30).text
    found = re.search(r"^radixgate_spec_decode_num_accepted_tokens(?:_total)? (\S+)$", text,
                      re.MULTILINE)
    assert found is not None, "no drafting counter in /metrics"
    return float(found.group(1))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_real_json_schema_answers_validate_and_stop(real: Live, name: str) -> None:
    client = real.openai()
    schema = SCHEMAS[name]
    messages: list[Any] = [{"role": "user", "content": QUESTIONS[name]}]
    before = accepted_drafts(real)
    for _ in range(2):
        completion = client.chat.completions.create(
            model="gpt-4o", messages=messages, max_tokens=200, temperature=0,
            response_format=json_schema_format(name, schema))  # type: ignore[arg-type]
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        answer = json.loads(choice.message.content or "")
        jsonschema.validate(answer, schema)
        messages += [{"role": "assistant", "content": choice.message.content},
                     {"role": "user", "content": "Again, the same answer please."}]
    assert accepted_drafts(real) > before  # the repeat was drafted, and stayed exact


def test_real_json_object_and_anthropic_output_config(real: Live) -> None:
    completion = real.openai().chat.completions.create(
        model="gpt-4o", max_tokens=120, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Describe a cat as a JSON object with name and "
                                              "age."}])
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content or ""), dict)
    message = real.anthropic().messages.create(
        model="claude-haiku-4-5", max_tokens=200,
        messages=[{"role": "user", "content": QUESTIONS["order"]}],
        output_config={"format": {"type": "json_schema", "schema": ORDER}})
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), ORDER)  # type: ignore[union-attr]
