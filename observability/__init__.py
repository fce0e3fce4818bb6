"""OpenTelemetry tracing and Prometheus metrics for the gateway.

- `tracing`: a `TracerProvider` from the `OTEL_*` environment (never set globally here);
- `asgi`: the HTTP SERVER span per request, continuing a W3C `traceparent`;
- `turn_spans`: the `chat {model}` span of a turn with its queue/prefill/decode children;
- `metrics`: the per-app Prometheus registry behind `GET /metrics`;
- `semconv`: attribute names (GenAI conventions and `radixgate.*`).

Depends on opentelemetry-sdk, prometheus-client and starlette; imports nothing of `engine`,
`sessions` or `gateway` (the gateway depends on this package, not the other way round).
"""

from observability.asgi import ServerSpanMiddleware
from observability.metrics import EngineStats, GatewayMetrics
from observability.tracing import TracingConfig, build_tracer_provider
from observability.turn_spans import ChatSpan, TurnOutcome

__all__ = ["ChatSpan", "EngineStats", "GatewayMetrics", "ServerSpanMiddleware", "TracingConfig",
           "TurnOutcome", "build_tracer_provider"]
