"""`create_app(settings)`: the gateway's FastAPI application.

The lifespan opens the Redis pool and the session store, the engine workers (given, or connected
to the addresses of `settings.engine_url`) and the tokenizer, and yields them as the typed
`State`; handlers reach them through `gateway.deps`. Nothing is created at import time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypedDict

from fastapi import FastAPI
from opentelemetry.trace import TracerProvider

from engine.client import EngineClient
from engine.models.locate import default_model, resolve_model_path
from engine.tokenizer import Tokenizer
from gateway.auth import KeyStore
from gateway.cache_scope import shared_prefix_of
from gateway.compat import (
    anthropic_routes,
    conversations_routes,
    models_route,
    openai_routes,
    responses_routes,
)
from gateway.compat.conversations_store import ConversationStore
from gateway.compat.responses_runs import ResponseRuns
from gateway.compat.responses_store import ResponseStore
from gateway.deps import Services
from gateway.engine_link import EngineLink
from gateway.engine_pool import EnginePool
from gateway.errors import ConfigError, install_error_handlers
from gateway.idempotency import IdempotencyStore
from gateway.limits import RequestLimits
from gateway.rate_limits import RateLimiter
from gateway.rendering import TurnRenderer
from gateway.routes import browse, health, metrics, session_events, sessions, ui
from gateway.settings import GatewaySettings
from gateway.shared_streams import SharedStreams
from gateway.store_supervisor import StoreSupervisor
from gateway.telemetry import Telemetry
from gateway.turns import TurnService
from observability import ServerSpanMiddleware, build_tracer_provider
from sessions import SessionStore
from sessions.durability import default_durability
from sessions.redis_client import StoreClient, open_client


class State(TypedDict):
    settings: GatewaySettings
    redis: StoreClient
    store: SessionStore
    keys: KeyStore
    idempotency: IdempotencyStore
    engine: EnginePool
    turns: TurnService
    model_name: str
    telemetry: Telemetry
    store_supervisor: StoreSupervisor | None  # the embedded Valkey's, when `serve` owns one
    streams: SharedStreams  # running streams a retry with their Idempotency-Key can join
    services: Services  # the turn route's collaborators in one object
    limiter: RateLimiter  # per-tenant and per-key limits (`gateway.rate_limits`)
    response_store: ResponseStore  # stored Responses API responses
    response_runs: ResponseRuns  # responses running on this gateway (cancel, background)
    conversation_store: ConversationStore  # the Conversations API's logs
    context_len: int  # the served model's context (prompt + output) in tokens; 0: unknown


def create_app(settings: GatewaySettings | None = None, *,
               engine_client: EngineClient | EngineLink | EnginePool | None = None,
               redis: StoreClient | None = None, tokenizer: Tokenizer | None = None,
               model_name: str | None = None,
               tracer_provider: TracerProvider | None = None,
               store_supervisor: StoreSupervisor | None = None) -> FastAPI:
    """Build the app. Without `engine_client`, the lifespan connects to `settings.engine_url`
    (required then; several workers: comma-separated addresses). Without `redis`, it opens
    `settings.redis_url` (required then; a cluster URL opens a cluster client,
    `sessions.redis_client`). Without `tokenizer`, it loads the one of
    `settings.model` (the embedded model by default). Without `tracer_provider`, spans go
    where the `OTEL_*` variables say (`observability.tracing`) and the lifespan shuts that
    provider down; a given provider stays the caller's."""
    settings = settings or GatewaySettings()
    owned_provider = None
    if tracer_provider is None:
        tracer_provider = owned_provider = build_tracer_provider()
    provider = tracer_provider

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[State]:
        owned_redis = redis is None
        client = redis if redis is not None else _open_redis(settings)
        pool = await _open_engine(settings, engine_client)
        tok = tokenizer or _load_tokenizer(settings)
        served, context_len = await _served_model(pool, tok, settings)
        durability = default_durability(client, settings.store_wait_replicas,
                                        settings.store_wait_timeout_ms)
        store = SessionStore(client, key_prefix=settings.key_prefix, durability=durability)
        renderer = TurnRenderer(tok)
        turns = TurnService(store, pool, renderer, pin_ttl_s=settings.pin_ttl_s,
                            max_tokens_limit=settings.max_tokens_limit, model_id=served,
                            max_queue_wait_s=settings.max_queue_wait_s,
                            shared_prefix=shared_prefix_of(settings, renderer))
        limiter = RateLimiter(client, settings.key_prefix)
        name = model_name or settings.model or default_model()
        idempotency = IdempotencyStore(client, settings.key_prefix)
        telemetry = Telemetry.create(provider)
        pool.on_route = telemetry.metrics.observe_route
        runs = ResponseRuns()
        try:
            yield State(settings=settings, redis=client, store=store,
                        keys=KeyStore(client, settings.auth_key_prefix),
                        idempotency=idempotency, engine=pool, turns=turns, model_name=name,
                        telemetry=telemetry, store_supervisor=store_supervisor,
                        streams=SharedStreams(),
                        services=Services(settings, turns, idempotency, telemetry, name,
                                          limiter),
                        limiter=limiter,
                        response_store=ResponseStore(
                            client, key_prefix=settings.key_prefix,
                            retention_s=settings.responses_retention_s),
                        response_runs=runs, context_len=context_len,
                        conversation_store=ConversationStore(
                            client, key_prefix=settings.key_prefix,
                            retention_s=settings.responses_retention_s))
        finally:
            await runs.aclose()
            await turns.leases.aclose()
            if owned_provider is not None:
                owned_provider.shutdown()  # flushes the batch exporters
            if engine_client is None:
                await pool.close()
            if owned_redis:
                await client.aclose()

    app = FastAPI(title="radixgate", version="0.1.0", lifespan=lifespan,
                  generate_unique_id_function=lambda route: f"{route.tags[0]}-{route.name}"
                  if route.tags else route.name)
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(browse.router)  # before `sessions`: GET /v1/sessions is the listing
    app.include_router(sessions.router)
    app.include_router(session_events.router)
    app.include_router(ui.router)
    app.include_router(metrics.router)
    for compat in (openai_routes, anthropic_routes, models_route, responses_routes,
                   conversations_routes):
        app.include_router(compat.router)
    app.add_middleware(RequestLimits, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(ServerSpanMiddleware, tracer_provider=provider)  # outermost: sees 413s
    return app


def _open_redis(settings: GatewaySettings) -> StoreClient:
    if settings.redis_url is None:
        raise RuntimeError("RADIXGATE_REDIS_URL is not set (`radixgate serve` starts one)")
    return open_client(settings.redis_url)


async def _open_engine(settings: GatewaySettings,
                       given: EngineClient | EngineLink | EnginePool | None) -> EnginePool:
    if isinstance(given, EnginePool):
        return given
    if isinstance(given, EngineLink):
        return EnginePool([given])
    if given is not None:
        return EnginePool([EngineLink(given, timeout_s=settings.engine_timeout_s)])
    if settings.engine_url is None:
        raise RuntimeError("RADIXGATE_ENGINE_URL is not set (`radixgate serve` spawns a worker)")
    links = []
    for address in settings.engine_url.split(","):
        client = await EngineClient.connect(address.strip())
        links.append(EngineLink(client, timeout_s=settings.engine_timeout_s,
                                name=address.strip()))
    return EnginePool(links)


async def _served_model(pool: EnginePool, tokenizer: Tokenizer,
                        settings: GatewaySettings) -> tuple[str, int]:
    """The engines' model id and context length (the smallest of the workers'), once every
    worker is known to serve one model whose vocabulary is the gateway's: the gateway renders
    token ids the engine must read the same way. Learns each worker's id. Raises ConfigError."""
    await pool.primary.live()
    try:
        stats = await pool.identify(timeout_s=settings.engine_timeout_s)
    except TimeoutError as exc:
        raise ConfigError("an engine worker did not answer its first stats request") from exc
    for s in stats:
        if s.vocab_hash and s.vocab_hash != tokenizer.vocab_hash:
            raise ConfigError(
                f"the engine serves {s.model!r}, whose vocabulary differs from the gateway's "
                f"tokenizer ({settings.model or 'the embedded model'}): start both with the "
                "same --model (RADIXGATE_MODEL)")
    if len({s.model for s in stats}) > 1:
        raise ConfigError("the engine workers serve different models: "
                          f"{sorted({s.model for s in stats})}; start them with one --model")
    return stats[0].model, min(s.context_len for s in stats)


def _load_tokenizer(settings: GatewaySettings) -> Tokenizer:
    return Tokenizer.from_model_path(resolve_model_path(settings.model))
