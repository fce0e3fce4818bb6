"""A live gateway on the real embedded model (SmolLM2-135M), for the examples and the SDK's
real-model agent tests: the real app in uvicorn on a free port, an in-process engine, real Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from engine.models.loader import load_model
from gateway.local_server import serve_local
from gateway.schemas import GenerateOptions
from gateway.settings import GatewaySettings
from tests.redis_keys import delete_key_prefix

# Tool calls land with `generate.tool_choice` (issue 6); until then the tool-loop tests skip.
HAS_TOOL_CALLS = "tool_choice" in GenerateOptions.model_fields
NO_TOOL_CALLS = "the gateway has no generate.tool_choice yet (tool calls, issue 6)"


@contextmanager
def real_model_gateway(redis_url: str) -> Iterator[str]:
    """Yield the base URL of a gateway serving the real model; its Redis keys are deleted
    afterwards."""
    torch.set_num_threads(2)
    loaded = load_model(None, "fp32", show_progress=False)
    prefix = f"test:{uuid.uuid4().hex}:"
    settings = GatewaySettings(redis_url=redis_url, key_prefix=prefix)
    try:
        with serve_local(loaded, settings, model_name="smollm2-135m",
                         kv_memory_bytes=256 << 20) as base_url:
            yield base_url
    finally:
        delete_key_prefix(redis_url, prefix)
