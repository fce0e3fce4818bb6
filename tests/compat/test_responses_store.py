"""Stored responses last: across a gateway restart and a store (Valkey) restart, and no longer
than their retention. Chained continuation by `previous_response_id` works after both."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import pytest
import torch

from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.compat.responses_store import ResponseNotFound, ResponseStore, StoredResponse
from gateway.local_server import serve_local
from gateway.settings import GatewaySettings
from sessions.embedded import EmbeddedValkey
from sessions.redis_client import open_client
from tests.tiny_model import tiny_model


def test_responses_survive_gateway_and_store_restarts(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    loaded = tiny_model(Tokenizer.from_gguf(embedded_gguf_path()))
    server = EmbeddedValkey(tmp_path / "valkey").start()
    try:
        settings = GatewaySettings(redis_url=server.url, key_prefix="rt:")
        with serve_local(loaded, settings, model_name="tiny",
                         kv_memory_bytes=64 << 20) as base_url:
            client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
            first = client.responses.create(model="tiny", input="remember this",
                                            max_output_tokens=4, temperature=0)
        server.stop()  # graceful: the AOF is flushed
        server = EmbeddedValkey(tmp_path / "valkey").start()
        settings = GatewaySettings(redis_url=server.url, key_prefix="rt:")
        with serve_local(loaded, settings, model_name="tiny",
                         kv_memory_bytes=64 << 20) as base_url:
            client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
            again = client.responses.retrieve(first.id)
            assert again.output_text == first.output_text and again.id == first.id
            # The new engine holds no KV: the tree's token path is resent, and it goes on.
            chained = client.responses.create(model="tiny", input="and now?",
                                              previous_response_id=first.id,
                                              max_output_tokens=4, temperature=0)
            assert chained.previous_response_id == first.id
            assert chained.usage is not None and first.usage is not None
            assert chained.usage.input_tokens > first.usage.input_tokens
    finally:
        server.stop()


async def _expiry(redis_url: str, prefix: str) -> None:
    client = open_client(redis_url)  # one server or a cluster (tests/cluster)
    try:
        store = ResponseStore(client, key_prefix=prefix, retention_s=1)
        record = StoredResponse("acme", {"id": "resp_short", "output": []}, [])
        await store.save(record)
        assert (await store.get("acme", "resp_short")).id == "resp_short"
        assert 0 < await store.ttl_s("resp_short") <= 1
        with pytest.raises(ResponseNotFound):
            await store.get("other", "resp_short")  # another tenant's is not found
        time.sleep(1.2)
        with pytest.raises(ResponseNotFound):
            await store.get("acme", "resp_short")
        default = ResponseStore(client, key_prefix=prefix)
        await default.save(StoredResponse("acme", {"id": "resp_long", "output": []}, []))
        assert 29 * 24 * 3600 < await default.ttl_s("resp_long") <= 30 * 24 * 3600
        await default.delete("acme", "resp_long")
        with pytest.raises(ResponseNotFound):
            await default.delete("acme", "resp_long")
    finally:
        await client.aclose()


def test_retention_is_bounded(redis_url: str, redis_key_prefix: str) -> None:
    asyncio.run(_expiry(redis_url, redis_key_prefix))
