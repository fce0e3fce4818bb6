"""The SDK's span helpers and `traceparent` injection, with and without opentelemetry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sdk._base import build_request, make_options
from sdk._tracing import agent_span, inject_trace_headers, tool_span

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def traced() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_agent_and_tool_spans(traced: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = traced
    with agent_span("coder", "sess-1", tracer_provider=provider) as agent:
        agent.set_attribute("radixgate.turn.id", "t1")
        with tool_span("read_file", "call_7", tracer_provider=provider) as tool:
            assert tool.is_recording
    spans = {s.name: s for s in exporter.get_finished_spans()}
    agent_s, tool_s = spans["invoke_agent coder"], spans["execute_tool read_file"]
    assert agent_s.kind is SpanKind.INTERNAL and tool_s.kind is SpanKind.INTERNAL
    assert dict(agent_s.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": "radixgate",
        "gen_ai.conversation.id": "sess-1", "gen_ai.agent.name": "coder",
        "radixgate.turn.id": "t1"}
    assert dict(tool_s.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read_file",
        "gen_ai.tool.type": "function", "gen_ai.tool.call.id": "call_7"}
    assert tool_s.parent is not None
    assert tool_s.parent.span_id == agent_s.context.span_id


def test_an_exception_marks_the_span_and_propagates(
        traced: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = traced
    with pytest.raises(KeyError), tool_span("lookup", "call_1", tracer_provider=provider):
        raise KeyError("missing")
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "KeyError"


def test_requests_carry_the_current_span_as_traceparent(
        traced: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, _ = traced
    with httpx.Client(base_url="http://gw") as client:
        outside = build_request(client, make_options("GET", "/v1/sessions/s"))
        assert "traceparent" not in outside.headers
        with agent_span("coder", "s", tracer_provider=provider) as agent:
            inside = build_request(client, make_options("POST", "/v1/sessions/s/turns"))
    assert agent.span is not None
    ctx = agent.span.get_span_context()
    expected = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert inside.headers["traceparent"] == expected
    assert inside.headers["Idempotency-Key"]  # the existing headers are kept


def test_without_opentelemetry_the_helpers_are_no_ops() -> None:
    code = ("import sys; sys.modules['opentelemetry'] = None\n"
            "import sdk\n"
            "from sdk._tracing import HAS_OTEL, agent_span, inject_trace_headers, tool_span\n"
            "assert not HAS_OTEL\n"
            "headers = {}\n"
            "with agent_span('a', 's') as span, tool_span('t', 'c') as tool:\n"
            "    span.set_attribute('k', 'v'); inject_trace_headers(headers)\n"
            "    assert not span.is_recording and not tool.is_recording\n"
            "assert headers == {}\n"
            "print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_inject_without_a_current_span_adds_nothing() -> None:
    headers: dict[str, str] = {}
    inject_trace_headers(headers)
    assert headers == {}
