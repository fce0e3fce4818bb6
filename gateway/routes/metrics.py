"""Prometheus `GET /metrics` (text exposition format 0.0.4). Open like `/healthz`: it names no
session or tenant."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

from gateway.deps import EngineDep, TelemetryDep
from gateway.engine_pool import combine_stats

router = APIRouter(tags=["metrics"])
STATS_TIMEOUT_S = 5.0


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}})
async def metrics(engine: EngineDep, telemetry: TelemetryDep) -> Response:
    """Per-turn metrics recorded by the gateway plus the engine workers' stats fetched now
    (summed over the workers that answer); without an answer, `radixgate_engine_up 0` and no
    engine metrics."""
    answered = [s for s in await engine.stats(STATS_TIMEOUT_S) if s is not None]
    stats = combine_stats(answered) if answered else None
    return Response(telemetry.metrics.render(stats), media_type=CONTENT_TYPE_PLAIN_0_0_4)
