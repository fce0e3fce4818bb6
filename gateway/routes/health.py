"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from engine.errors import EngineError
from gateway.deps import EngineDep, SessionStoreDep
from gateway.schemas import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(store: SessionStoreDep, engine: EngineDep) -> JSONResponse:
    """200 when Redis answers PING and the engine answers a stats request; else 503."""
    try:
        redis_ok = bool(await store.redis.ping())
    except RedisError:
        redis_ok = False
    ready = Readiness(status="unavailable", redis=redis_ok, engine=False,
                      engine_pid=engine.pid, engine_restarts=engine.restarts)
    try:
        stats = await engine.client.stats(timeout_s=5.0)
    except (EngineError, TimeoutError):
        pass
    else:
        ready = ready.model_copy(update={
            "engine": True, "model": stats.model, "num_running": stats.num_running,
            "num_free_pages": stats.num_free_pages, "prefix_hit_rate": stats.hit_rate})
    if ready.redis and ready.engine:
        ready = ready.model_copy(update={"status": "ok"})
    return JSONResponse(ready.model_dump(), status_code=200 if ready.status == "ok" else 503)
