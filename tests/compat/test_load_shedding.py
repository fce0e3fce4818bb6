"""Load shedding through the real clients: once the engine's own estimate of a turn's wait for
its first token passes `max_queue_wait_s`, the turn is refused at once with a typed 503
`overloaded` (Anthropic's 529) and `Retry-After`, and nothing of it is stored or left held.

The bound here is a microsecond, which the probe's round trip alone passes: every turn is
over it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import torch

from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from tests.compat.conftest import Live, live_gateway
from tests.tiny_model import tiny_model

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def shedding(redis_url: str) -> Iterator[Live]:
    torch.set_num_threads(1)
    with live_gateway(tiny_model(Tokenizer.from_gguf(embedded_gguf_path())), redis_url, "tiny",
                      max_queue_wait_s=1e-6) as gateway:
        yield gateway


def test_turns_past_the_bound_get_typed_refusals(shedding: Live) -> None:
    message: Any = {"role": "user", "content": "hello there"}
    with httpx.Client(base_url=shedding.base_url, timeout=60,
                      headers={"Authorization": f"Bearer {shedding.key}"}) as http:
        sid = http.post("/v1/sessions", json={}).json()["id"]
        body = {"messages": [message], "generate": {"max_tokens": 2}}
        shed = http.post(f"/v1/sessions/{sid}/turns", json=body)
        assert shed.status_code == 503
        assert shed.json()["error"]["type"] == "overloaded"
        assert "--max-queue-wait" in shed.json()["error"]["message"]
        assert int(shed.headers["retry-after"]) >= 1
        session = http.get(f"/v1/sessions/{sid}").json()
        assert len(session["turns"]) == 1  # the root: nothing of the refused turn was stored
        streamed = http.post(f"/v1/sessions/{sid}/turns",
                             json={**body, "generate": {"max_tokens": 2, "stream": True}})
        assert streamed.status_code == 503  # refused before the stream opened
    shedding.session(sid)  # the store's invariants hold: no lease or branch left behind

    with pytest.raises(openai.APIStatusError) as oa:
        shedding.openai().chat.completions.create(model="tiny", max_tokens=2,
                                                  messages=[message])
    assert oa.value.status_code == 503
    assert oa.value.body["code"] == "overloaded"  # type: ignore[index]
    assert oa.value.response.headers["x-should-retry"] == "true"

    with pytest.raises(anthropic.OverloadedError) as an:
        shedding.anthropic().messages.create(model="claude-sonnet-4-5", max_tokens=2,
                                             messages=[message])
    assert an.value.status_code == 529
    assert an.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert int(an.value.response.headers["retry-after"]) >= 1
