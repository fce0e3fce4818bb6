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

from engine.client import EngineClient
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.app import create_app
from gateway.engine_link import EngineLink
from gateway.settings import GatewaySettings
from sessions.redis_client import StoreClient, open_client
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
    redis: StoreClient
    settings: GatewaySettings
    engine_client: EngineClient
    tokenizer: Tokenizer
    link: EngineLink
    make_engine: Callable[[], Engine]

    async def restart_engine(self) -> None:
        """What the supervisor does when the worker dies: the link goes down (requests in
        flight fail with engine_shutdown), then a fresh engine, holding no cache, takes over."""
        await self.link.mark_down()
        self.engine = self.make_engine()
        self.engine_client = EngineClient.in_process(self.engine)
        await self.link.replace(self.engine_client, None)


Body = Callable[[Harness], Awaitable[None]]


@pytest.fixture
def run_gateway(redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
                tokenizer: Tokenizer) -> Callable[..., None]:
    """`run_gateway(body, restart_timeout_s=None, redis_url=None, **settings)`: run
    `body(harness)` against a fresh app and engine. With `restart_timeout_s` the engine link is
    supervised (`Harness.restart_engine` plays a worker restart); `redis_url` replaces the test
    server (e.g. a dead port)."""

    def run(body: Body, *, restart_timeout_s: float | None = None,
            redis_url: str = redis_url, **overrides: object) -> None:
        settings = GatewaySettings(redis_url=redis_url, key_prefix=redis_key_prefix,
                                   **overrides)  # type: ignore[arg-type]

        def make_engine() -> Engine:
            return Engine(tiny_loaded, EngineConfig(kv_memory_bytes=64 << 20))

        async def main() -> None:
            engine = make_engine()
            engine_client = EngineClient.in_process(engine)
            link = EngineLink(engine_client, restart_timeout_s=restart_timeout_s)
            redis = open_client(redis_url)  # one server or a cluster (tests/cluster)
            app = create_app(settings, engine_client=link, redis=redis,
                             tokenizer=tokenizer, model_name="tiny")
            harness: Harness | None = None
            try:
                async with LifespanManager(app) as manager:
                    transport = httpx.ASGITransport(app=manager.app)
                    async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                                 timeout=60) as client:
                        harness = Harness(app, client, engine, redis, settings, engine_client,
                                          tokenizer, link, make_engine)
                        await body(harness)
            finally:
                await (harness.engine_client if harness else engine_client).close()
                await redis.aclose()

        asyncio.run(main())

    return run
