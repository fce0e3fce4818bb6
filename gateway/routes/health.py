"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from gateway.deps import EngineDep, SessionStoreDep
from gateway.engine_pool import combine_stats
from gateway.schemas import Health, Readiness, WorkerReadiness
from gateway.store_supervisor import StoreSupervisor

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request, store: SessionStoreDep, engine: EngineDep) -> JSONResponse:
    """200 when Redis answers PING and an engine worker answers a stats request; else 503.
    Engine figures are summed over the workers that answer; `engine_pid`/`engine_restarts` are
    the first worker's, `workers` lists each."""
    try:
        redis_ok = bool(await store.redis.ping())
    except RedisError:
        redis_ok = False
    supervisor: StoreSupervisor | None = request.state.store_supervisor
    first = engine.primary
    ready = Readiness(status="unavailable", redis=redis_ok, engine=False,
                      engine_pid=first.pid, engine_restarts=first.restarts,
                      store_pid=supervisor.pid if supervisor else None,
                      store_restarts=supervisor.num_restarts if supervisor else 0)
    each = await engine.stats(5.0)
    ready = ready.model_copy(update={"workers": [
        WorkerReadiness(name=link.name, worker_id=link.worker_id, up=s is not None,
                        pid=link.pid, restarts=link.restarts,
                        num_running=s.num_running if s else None)
        for link, s in zip(engine.links, each, strict=True)]})
    answered = [s for s in each if s is not None]
    if answered:
        stats = combine_stats(answered)
        ready = ready.model_copy(update={
            "engine": True, "model": stats.model, "num_running": stats.num_running,
            "num_free_pages": stats.num_free_pages, "num_pages": stats.num_pages,
            "num_cached_pages": stats.num_cached_pages, "num_held_pages": stats.num_held_pages,
            "num_pins": stats.num_pins, "prefix_hit_rate": stats.hit_rate})
    if ready.redis and ready.engine:
        ready = ready.model_copy(update={"status": "ok"})
    if ready.status == "ok":
        return JSONResponse(ready.model_dump())
    return JSONResponse(ready.model_dump(), status_code=503, headers={"Retry-After": "1"})
