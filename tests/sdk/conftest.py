"""A live gateway for the SDK: the real app in a real uvicorn on a free port, in a background
thread, over the tiny random-weight model, an in-process engine and the real Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import torch

from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.local_server import serve_local
from gateway.settings import GatewaySettings
from tests.redis_keys import delete_key_prefix
from tests.tiny_model import tiny_model

MAX_BODY_BYTES = 8192


@pytest.fixture(scope="module")
def live_server(redis_url: str) -> Iterator[str]:
    """Base URL of a running gateway; its Redis keys are deleted afterwards."""
    torch.set_num_threads(1)
    tokenizer = Tokenizer.from_gguf(embedded_gguf_path())
    loaded = tiny_model(tokenizer)
    prefix = f"test:{uuid.uuid4().hex}:"
    settings = GatewaySettings(redis_url=redis_url, key_prefix=prefix,
                               max_body_bytes=MAX_BODY_BYTES)
    try:
        with serve_local(loaded, settings, model_name="tiny",
                         kv_memory_bytes=64 << 20) as base_url:
            yield base_url
    finally:
        delete_key_prefix(redis_url, prefix)
