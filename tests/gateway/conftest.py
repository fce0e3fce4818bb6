"""Gateway fixtures: a tiny random-weight Llama with the real SmolLM2 tokenizer, an in-process
engine, the real Redis under the test's key prefix, and the app driven over ASGI.

No pytest-asyncio: each test body runs in its own `asyncio.run` through `run_gateway`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import pytest
import torch
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from redis.asyncio import Redis

from engine.client import EngineClient
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.tiny_model import tiny_model


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(embedded_gguf_path())


@pytest.fixture(scope="session")
def tiny_loaded(tokenizer: Tokenizer) -> LoadedModel:
    torch.set_num_threads(1)
    return tiny_model(tokenizer)


@dataclass
class Harness:
    app: FastAPI
    client: httpx.AsyncClient
    engine: Engine
    redis: Redis
    settings: GatewaySettings
    engine_client: EngineClient
    tokenizer: Tokenizer


Body = Callable[[Harness], Awaitable[None]]


@pytest.fixture
def run_gateway(redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
                tokenizer: Tokenizer) -> Callable[..., None]:
    """`run_gateway(body, **settings)`: run `body(harness)` against a fresh app and engine."""

    def run(body: Body, **overrides: object) -> None:
        settings = GatewaySettings(redis_url=redis_url, key_prefix=redis_key_prefix,
                                   **overrides)  # type: ignore[arg-type]

        async def main() -> None:
            engine = Engine(tiny_loaded, EngineConfig(kv_memory_bytes=64 << 20))
            engine_client = EngineClient.in_process(engine)
            redis = Redis.from_url(redis_url)
            app = create_app(settings, engine_client=engine_client, redis=redis,
                             tokenizer=tokenizer, model_name="tiny")
            try:
                async with LifespanManager(app) as manager:
                    transport = httpx.ASGITransport(app=manager.app)
                    async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                                 timeout=60) as client:
                        await body(Harness(app, client, engine, redis, settings, engine_client,
                                           tokenizer))
            finally:
                await engine_client.close()
                await redis.aclose()

        asyncio.run(main())

    return run
