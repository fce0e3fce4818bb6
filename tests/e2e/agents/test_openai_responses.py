"""The `openai` SDK's Responses API, unmodified, against a live `radixgate serve` on the embedded
SmolLM2-135M: create, a streamed chain and a fork through `previous_response_id`, a full resend
with `store: false`, retrieve, `input_items`, structured output with `responses.parse`, delete.

Every request after the first reads its history from the prefix cache
(`usage.input_tokens_details.cached_tokens`), whichever way it names that history.
"""

from __future__ import annotations

from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from tests.e2e.agents.live_serve import LiveServer

pytestmark = pytest.mark.slow

INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."


class Capital(BaseModel):
    country: Literal["France", "Italy", "Norway"]
    capital: str


def test_openai_sdk_responses_on_the_real_model(live_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="anything",
                           max_retries=0, timeout=300)
    first = client.responses.create(model=live_server.model, instructions=INSTRUCTIONS,
                                    input="What is the capital of France?",
                                    max_output_tokens=40, temperature=0)
    assert first.status == "completed" and "Paris" in first.output_text
    assert first.usage is not None

    with client.responses.stream(model=live_server.model, instructions=INSTRUCTIONS,
                                 previous_response_id=first.id,
                                 input="And of Italy?", max_output_tokens=40,
                                 temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        chained = stream.get_final_response()
    assert chained.output_text == "".join(deltas) and "Rome" in chained.output_text
    assert chained.usage is not None
    assert chained.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16

    fork = client.responses.create(model=live_server.model, instructions=INSTRUCTIONS,
                                   previous_response_id=first.id, input="And of Norway?",
                                   max_output_tokens=40, temperature=0)
    assert fork.usage is not None and "Oslo" in fork.output_text
    assert fork.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16

    # The same conversation resent whole, as Codex and openai-agents do: placed by prefix.
    resent = client.responses.create(
        model=live_server.model, instructions=INSTRUCTIONS, store=False,
        input=[{"role": "user", "content": "What is the capital of France?"},
               {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "And of Italy?"},
               {"role": "assistant", "content": chained.output_text},
               {"role": "user", "content": "Which of the two is bigger?"}],
        max_output_tokens=40, temperature=0)
    assert resent.usage is not None
    assert resent.usage.input_tokens_details.cached_tokens >= chained.usage.input_tokens - 16

    assert client.responses.retrieve(chained.id).output_text == chained.output_text
    items = client.responses.input_items.list(chained.id)
    assert [i.type for i in items.data] == ["message"] and items.has_more is False

    parsed = client.responses.parse(model=live_server.model, instructions=INSTRUCTIONS,
                                    previous_response_id=chained.id,
                                    input="Give Italy's capital as JSON.", text_format=Capital,
                                    max_output_tokens=60, temperature=0)
    assert isinstance(parsed.output_parsed, Capital)

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError):  # its turn stays, its record is gone
        client.responses.create(model=live_server.model, previous_response_id=first.id,
                                input="again")
    print(f"\nopenai SDK Responses on {live_server.model}: cached "
          f"{chained.usage.input_tokens_details.cached_tokens}/{chained.usage.input_tokens} "
          f"(chain), {resent.usage.input_tokens_details.cached_tokens}/"
          f"{resent.usage.input_tokens} (full resend)")
