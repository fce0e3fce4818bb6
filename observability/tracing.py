"""OpenTelemetry tracer provider from the standard `OTEL_*` environment variables.

    OTEL_EXPORTER_OTLP_ENDPOINT or        an OTLP/HTTP exporter (the exporter itself reads the
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT    endpoint, headers, timeout and compression variables)
    RADIXGATE_TRACE_CONSOLE=1             a console exporter (spans as JSON on stdout)
    neither                               a provider with no exporter: spans are made, then dropped
    OTEL_SDK_DISABLED=true                the SDK hands out no-op tracers (its own rule)
    OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER   as the SDK defines them

Nothing here sets the process-global tracer provider: callers pass the provider into
`gateway.app.create_app(tracer_provider=...)`; only a `main()` may make it global.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

DEFAULT_SERVICE_NAME = "radixgate"
_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class TracingConfig:
    """What `build_tracer_provider` wires up. Build with `from_env`, or directly in tests."""

    service_name: str = DEFAULT_SERVICE_NAME
    enable_otlp: bool = False
    enable_console: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TracingConfig:
        """Read the variables listed in the module docstring (default: `os.environ`). Does not
        mutate anything; raises nothing."""
        env = os.environ if env is None else env
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT")
        service = env.get("OTEL_SERVICE_NAME") or _service_from_attributes(
            env.get("OTEL_RESOURCE_ATTRIBUTES", "")) or DEFAULT_SERVICE_NAME
        return cls(service_name=service, enable_otlp=bool(endpoint),
                   enable_console=env.get("RADIXGATE_TRACE_CONSOLE", "").lower() in _TRUE)


def build_tracer_provider(config: TracingConfig | None = None) -> TracerProvider:
    """A new SDK `TracerProvider` with the exporters `config` asks for (default: from the
    environment); with none, one that records nothing. Batch span processors; the caller owns
    the provider and must `shutdown()` it (which flushes). Never registers it globally."""
    config = config or TracingConfig.from_env()
    resource = Resource.create({SERVICE_NAME: config.service_name})
    # With no exporter nothing would read the spans: they are not recorded at all (the
    # request path then pays for no span), though trace context still propagates.
    sampler = None if config.enable_otlp or config.enable_console else ALWAYS_OFF
    provider = TracerProvider(resource=resource, shutdown_on_exit=False, sampler=sampler)
    if config.enable_otlp:
        # Imported here: the OTLP exporter pulls in protobuf and requests, needed only then.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if config.enable_console:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stdout)))
    return provider


def _service_from_attributes(raw: str) -> str | None:
    """`service.name` out of `OTEL_RESOURCE_ATTRIBUTES` ("k1=v1,k2=v2"), if there."""
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() == SERVICE_NAME and value.strip():
            return value.strip()
    return None
