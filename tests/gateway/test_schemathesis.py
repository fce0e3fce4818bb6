"""schemathesis against `/openapi.json`: no generated request, valid or not, gets a 5xx.

The gateway runs in a real uvicorn on a free port (a thread with its own event loop, the tiny
random-weight model in-process, the real Redis under a key prefix of this module). Streaming is
out of scope: every body's `generate.stream` is forced to false. Half the cases (chosen by the
generated data, so shrinking stays deterministic) are aimed at a real session and turn, so the
routes run past the 404 of an unknown id.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from engine.models.loader import LoadedModel
from engine.tokenizer import Tokenizer
from gateway.app import create_app
from gateway.local_server import serve_local
from gateway.settings import GatewaySettings
from tests.redis_keys import delete_key_prefix

MAX_EXAMPLES = 25
MAX_TOKENS_LIMIT = 8  # generated max_tokens above it are a 400; below, generation stays short


@dataclass(frozen=True)
class Known:
    """A real session of the live gateway and one of its turns."""

    base_url: str
    session_id: str
    turn_id: str


@pytest.fixture(scope="module")
def live(redis_url: str, tiny_loaded: LoadedModel, tokenizer: Tokenizer) -> Iterator[Known]:
    prefix = f"test:{uuid.uuid4().hex}:"
    settings_ = GatewaySettings(redis_url=redis_url, key_prefix=prefix,
                                max_tokens_limit=MAX_TOKENS_LIMIT)
    try:
        with serve_local(tiny_loaded, settings_, model_name="tiny",
                         kv_memory_bytes=64 << 20) as base_url:
            with httpx.Client(base_url=base_url, timeout=30) as http:
                sid = http.post("/v1/sessions", json={"system": "Be brief."}).json()["id"]
                turn = http.post(f"/v1/sessions/{sid}/turns", json={
                    "messages": [{"role": "user", "content": "hi"}],
                    "generate": {"max_tokens": 2}}).json()
            yield Known(base_url, sid, turn["id"])
    finally:
        delete_key_prefix(redis_url, prefix)


# The OpenAPI document needs no lifespan: build it from an app that never starts.
schema = schemathesis.openapi.from_dict(create_app(GatewaySettings()).openapi())


def _non_streaming(case: Any) -> None:
    """`generate.stream` false; a missing `max_tokens` (default 256, over the limit) becomes 4."""
    body = case.body
    if isinstance(body, dict) and "messages" in body:
        generate = body.setdefault("generate", {})
        if isinstance(generate, dict):
            generate["stream"] = False
            generate.setdefault("max_tokens", 4)


def _aim(case: Any, known: Known) -> None:
    """Point the case at the real session (and turn), without generated credentials or
    If-Match, when its generated session id has an even length; DELETE keeps its random id so
    the session survives the module."""
    params = case.path_parameters
    if not params or "session_id" not in params or case.method.upper() == "DELETE":
        return
    if len(str(params["session_id"])) % 2:
        return
    params["session_id"] = known.session_id
    headers = case.headers or {}
    for name in [n for n in headers if n.lower() in ("if-match", "authorization", "x-api-key")]:
        del headers[name]
    if "turn_id" in params:
        params["turn_id"] = known.turn_id
    if isinstance(case.body, dict):
        for field in ("from_turn_id", "to_turn_id", "parent_turn_id"):
            if isinstance(case.body.get(field), str):
                case.body[field] = known.turn_id


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: Any, live: Known) -> None:
    _non_streaming(case)
    _aim(case, live)
    case.call_and_validate(base_url=live.base_url, checks=[not_a_server_error])
