"""A live gateway (real uvicorn on a free port, in-process engine, the real Redis under a key
prefix of its own) for the compatible routes, driven by the official `openai` and `anthropic`
clients. Two API keys exist, so every request authenticates and tenants are isolated."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
import torch

from engine.models.loader import LoadedModel
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.auth import KeyStore
from gateway.local_server import serve_local
from gateway.settings import GatewaySettings
from sessions import SessionStore
from sessions.redis_client import open_client
from tests.redis_keys import delete_key_prefix
from tests.tiny_model import tiny_model

PAGE_SIZE = 16  # EngineConfig's default, the granularity of the prefix cache
MAX_BODY_BYTES = 64 * 1024
# A small bounded tool: even the random model's constrained call ends within a few tokens.
WEATHER_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}


@dataclass(frozen=True)
class Live:
    base_url: str
    key: str  # tenant "alpha"
    other_key: str  # tenant "beta"
    redis_url: str
    key_prefix: str

    def openai(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=key or self.key,
                             max_retries=0, timeout=120)

    def anthropic(self, key: str | None = None, **kwargs: Any) -> anthropic.Anthropic:
        options: dict[str, Any] = {"api_key": key or self.key, **kwargs}
        return anthropic.Anthropic(base_url=self.base_url, max_retries=0, timeout=120, **options)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=120,
                            headers={"Authorization": f"Bearer {self.key}"})

    def session(self, session_id: str) -> dict[str, Any]:
        """The native view of a session (its branches and turns), after checking the invariants
        of its stored tree and path index."""
        asyncio.run(self._check_invariants(session_id))
        with self.http() as http:
            r = http.get(f"/v1/sessions/{session_id}")
            r.raise_for_status()
            body: dict[str, Any] = r.json()
            return body

    async def _check_invariants(self, session_id: str) -> None:
        client = open_client(self.redis_url)
        try:
            store = SessionStore(client, key_prefix=self.key_prefix)
            await store.check_invariants(session_id)
            await store.paths.check_invariants(session_id)
        finally:
            await client.aclose()


async def _create_keys(redis_url: str, settings: GatewaySettings) -> tuple[str, str]:
    client = open_client(redis_url)
    try:
        keys = KeyStore(client, settings.auth_key_prefix)
        return await keys.create("alpha"), await keys.create("beta")
    finally:
        await client.aclose()


@contextmanager
def live_gateway(loaded: LoadedModel, redis_url: str, model_name: str,
                 **settings_fields: Any) -> Iterator[Live]:
    """Serve `loaded` on a free port with two API keys; delete every key it wrote afterwards.
    `settings_fields`: more GatewaySettings fields."""
    prefix = f"test:{uuid.uuid4().hex}:"
    settings = GatewaySettings(redis_url=redis_url, key_prefix=prefix,
                               max_body_bytes=MAX_BODY_BYTES, **settings_fields)
    try:
        key, other_key = asyncio.run(_create_keys(redis_url, settings))
        with serve_local(loaded, settings, model_name=model_name,
                         kv_memory_bytes=128 << 20) as base_url:
            yield Live(base_url, key, other_key, redis_url, prefix)
    finally:
        delete_key_prefix(redis_url, prefix)


@pytest.fixture(scope="module")
def live(redis_url: str) -> Iterator[Live]:
    """The tiny random-weight model: fast, meaningless text, valid constrained tool calls."""
    torch.set_num_threads(1)
    with live_gateway(tiny_model(Tokenizer.from_gguf(embedded_gguf_path())), redis_url,
                      "tiny") as gateway:
        yield gateway
