"""A gateway over ASGI with two tenants' API keys ("alpha", "beta"), in-process engines built
from a given `EngineConfig` (KV tiers, several workers), and the official `openai` and
`anthropic` async clients bound to it: for the prefix-cache isolation tests, which read cached
tokens from usage only."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import httpx2
import openai
from asgi_lifespan import LifespanManager
from redis.asyncio import Redis

from engine.client import EngineClient
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.tokenizer import Tokenizer
from gateway.app import create_app
from gateway.auth import KeyStore
from gateway.engine_link import EngineLink
from gateway.engine_pool import EnginePool
from gateway.settings import GatewaySettings

PAGE_SIZE = 16  # EngineConfig's default
# A long prompt (many pages) whose only variation is the tenant and salt asking.
PROMPT = "Summarise the build log: " + "step ok; " * 40


@dataclass
class Tenants:
    http: httpx.AsyncClient  # no key: pass `headers=tenants.auth(...)`
    http2: httpx2.AsyncClient  # the same app, for the openai and anthropic SDKs (httpx2)
    keys: dict[str, str]  # tenant -> API key
    engines: list[Engine]
    pool: EnginePool

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def openai(self, tenant: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url="http://gw/v1", api_key=self.keys[tenant],
                                  http_client=self.http2, max_retries=0)

    def anthropic(self, tenant: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url="http://gw", api_key=self.keys[tenant],
                                        http_client=self.http2, max_retries=0)

    async def chat(self, tenant: str, text: str = PROMPT, *, salt: str | None = None,
                   system: str | None = None) -> int:
        """cached_tokens of one OpenAI chat completion."""
        messages: list[Any] = [{"role": "user", "content": text}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        extra = {"cache_salt": salt} if salt is not None else None
        reply = await self.openai(tenant).chat.completions.create(
            model="tiny", messages=messages, max_tokens=2, temperature=0, extra_body=extra)
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        return reply.usage.prompt_tokens_details.cached_tokens or 0

    def quiesce(self) -> Awaitable[Any]:
        """A stats round trip to every worker: pins and finishes sent before it are applied."""
        return self.pool.stats(timeout_s=30)

    def evict_device_caches(self) -> None:
        """Drop every unlocked cached prefix from each worker's device pool (the host tier, if
        any, keeps what it drops). Call after `quiesce`: the engines are idle then."""
        for engine in self.engines:
            engine.reset_cache()


Body = Callable[[Tenants], Awaitable[None]]


def run_tenants(body: Body, *, redis_url: str, key_prefix: str, loaded: LoadedModel,
                tokenizer: Tokenizer, config: EngineConfig | None = None, num_workers: int = 1,
                **settings: Any) -> None:
    """`body(tenants)` against a fresh app with `num_workers` engines of `config`; then every
    engine's invariants are checked."""

    async def main() -> None:
        engines = [Engine(loaded, config or EngineConfig(kv_memory_bytes=32 << 20))
                   for _ in range(num_workers)]
        links = [EngineLink(EngineClient.in_process(e), name=f"w{i}")
                 for i, e in enumerate(engines)]
        pool = EnginePool(links)
        redis = Redis.from_url(redis_url)
        app = create_app(GatewaySettings(redis_url=redis_url, key_prefix=key_prefix, **settings),
                         engine_client=pool, redis=redis, tokenizer=tokenizer,
                         model_name="tiny")
        try:
            store = KeyStore(redis, f"{key_prefix}auth:")
            keys = {t: await store.create(t) for t in ("alpha", "beta")}
            async with LifespanManager(app) as manager:
                transport = httpx.ASGITransport(app=manager.app)
                transport2 = httpx2.ASGITransport(app=manager.app)
                async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                             timeout=60) as http, httpx2.AsyncClient(
                        transport=transport2, base_url="http://gw", timeout=60) as http2:
                    await body(Tenants(http, http2, keys, engines, pool))
            for engine in engines:
                engine.check_invariants()
        finally:
            for link in links:
                await link.close()
            await redis.aclose()

    asyncio.run(main())
