"""Gateway fixtures: a tiny random-weight Llama with the real SmolLM2 tokenizer, an in-process
engine, the real Redis under the test's key prefix, and the app driven over ASGI.

No pytest-asyncio: each test body runs in its own `asyncio.run` through `run_gateway`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from redis.asyncio import Redis

from engine.client import EngineClient
from engine.config import ModelConfig
from engine.engine import Engine, EngineConfig
from engine.models.llama import LayerWeights, LlamaModel, LlamaWeights
from engine.models.loader import LoadedModel
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.app import create_app
from gateway.settings import GatewaySettings


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(embedded_gguf_path())


def tiny_model(tokenizer: Tokenizer, seed: int = 0) -> LoadedModel:
    """2 layers, hidden 64, 4 heads / 2 KV heads of 16: random weights, the real vocabulary."""
    cfg = ModelConfig(architecture="llama", num_layers=2, hidden_size=64, intermediate_size=128,
                      num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=tokenizer.vocab_size,
                      rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.05

    qkv_rows = cfg.q_size + 2 * cfg.kv_size
    layers = [LayerWeights(attn_norm=torch.ones(64), qkv=rand(qkv_rows, 64), qkv_bias=None,
                           o=rand(64, cfg.q_size), ffn_norm=torch.ones(64),
                           gate_up=rand(256, 64), down=rand(64, 128))
              for _ in range(cfg.num_layers)]
    embed = rand(cfg.vocab_size, 64)
    weights = LlamaWeights(embed=embed, layers=layers, norm=torch.ones(64), lm_head=embed)
    return LoadedModel(Path("tiny-random"), LlamaModel(cfg, weights, torch.float32), tokenizer, 0.0)


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
