"""OpenTelemetry spans and W3C trace-context propagation for the SDK, when opentelemetry-api is
installed (`pip install radixgate[tracing]`); without it every helper here is a no-op.

    invoke_agent {agent}      INTERNAL  one agent-loop iteration (`agent_span`)
     ├─ POST /v1/sessions/{session_id}/turns   the gateway's SERVER span, via `traceparent`
     │    └─ chat {model} → queue / prefill / decode
     └─ execute_tool {tool}   INTERNAL  one tool call (`tool_span`)

Spans come from `tracer_provider` when given, else from the process-global provider (which the
application sets; the SDK never sets it). `inject_trace_headers` runs for every request the
clients send, so each HTTP call carries the current span's `traceparent` (and `tracestate`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

try:
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    HAS_OTEL = True
except ImportError:  # the SDK's base install has no opentelemetry
    HAS_OTEL = False

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

TRACER_NAME = "radixgate.sdk"
PROVIDER = "radixgate"
AttributeValue = str | bool | int | float


class SpanHandle:
    """What the span helpers yield: set attributes on the span, or do nothing without one."""

    def __init__(self, span: Span | None) -> None:
        self.span = span

    @property
    def is_recording(self) -> bool:
        return self.span is not None and self.span.is_recording()

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if self.span is not None:
            self.span.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self.span is not None:
            self.span.set_attributes(dict(attributes))


def inject_trace_headers(headers: MutableMapping[str, str]) -> None:
    """Add `traceparent` (and `tracestate`) of the current span to `headers`, in place.
    Nothing without opentelemetry or without a valid current span."""
    if HAS_OTEL:
        TraceContextTextMapPropagator().inject(headers)


def agent_span(agent_name: str, session_id: str, *,
               tracer_provider: TracerProvider | None = None) -> AbstractContextManager[SpanHandle]:
    """`invoke_agent {agent_name}`, current for the body (so requests sent inside carry it).
    An exception leaving the body is recorded, sets `error.type` and status ERROR, and
    propagates."""
    return _invoke_span("invoke_agent", "gen_ai.agent.name", agent_name, session_id,
                        tracer_provider)


def workflow_span(workflow_name: str, session_id: str, *,
                  tracer_provider: TracerProvider | None = None
                  ) -> AbstractContextManager[SpanHandle]:
    """`invoke_workflow {workflow_name}`: one agent-loop run (all its `invoke_agent`
    iterations and tool calls), so a run is one trace. Exceptions as in `agent_span`."""
    return _invoke_span("invoke_workflow", "gen_ai.workflow.name", workflow_name, session_id,
                        tracer_provider)


def _invoke_span(operation: str, name_key: str, name: str, session_id: str,
                 tracer_provider: TracerProvider | None) -> AbstractContextManager[SpanHandle]:
    """`{operation} {name}` (or just `{operation}` unnamed) with the GenAI attributes."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": operation, "gen_ai.provider.name": PROVIDER,
        "gen_ai.conversation.id": session_id}
    if name:
        attributes[name_key] = name
    return _span(f"{operation} {name}" if name else operation, attributes, tracer_provider)


@contextmanager
def tool_span(tool_name: str, call_id: str, *, session_id: str | None = None,
              tracer_provider: TracerProvider | None = None) -> Iterator[SpanHandle]:
    """`execute_tool {tool_name}` for one tool call, current for the body. Exceptions as in
    `agent_span`."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool_name,
        "gen_ai.tool.type": "function"}
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    if session_id:
        attributes["gen_ai.conversation.id"] = session_id
    with _span(f"execute_tool {tool_name}", attributes, tracer_provider) as handle:
        yield handle


@contextmanager
def _span(name: str, attributes: dict[str, AttributeValue],
          tracer_provider: TracerProvider | None) -> Iterator[SpanHandle]:
    if not HAS_OTEL:
        yield SpanHandle(None)
        return
    tracer = otel_trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
    with tracer.start_as_current_span(name, kind=otel_trace.SpanKind.INTERNAL,
                                      attributes=attributes) as span:
        try:
            yield SpanHandle(span)
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__qualname__)
            raise
