"""`TracingConfig.from_env` and `build_tracer_provider`: OTLP/HTTP to a real local receiver,
the console exporter, and the exporter-less default."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from observability.tracing import TracingConfig, build_tracer_provider


def test_config_from_env() -> None:
    assert TracingConfig.from_env({}) == TracingConfig("radixgate", False, False)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
           "RADIXGATE_TRACE_CONSOLE": "1", "OTEL_SERVICE_NAME": "gw-a"}
    assert TracingConfig.from_env(env) == TracingConfig("gw-a", True, True)
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces",
           "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=dev,service.name=gw-b"}
    assert TracingConfig.from_env(env) == TracingConfig("gw-b", True, False)
    assert not TracingConfig.from_env({"RADIXGATE_TRACE_CONSOLE": "0"}).enable_console


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[tuple[str, bytes]]

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.bodies.append((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[HTTPServer]:
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_otlp_exporter_sends_to_the_endpoint(otlp_receiver: HTTPServer,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{otlp_receiver.server_address[1]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "radixgate-test")
    provider = build_tracer_provider()
    with provider.get_tracer("test").start_as_current_span("exported"):
        pass
    provider.shutdown()  # flushes the batch processor
    bodies = otlp_receiver.bodies  # type: ignore[attr-defined]
    assert [path for path, _ in bodies] == ["/v1/traces"]
    request = ExportTraceServiceRequest.FromString(bodies[0][1])
    (resource_spans,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "radixgate-test"
    names = [s.name for ss in resource_spans.scope_spans for s in ss.spans]
    assert names == ["exported"]


def test_console_exporter_prints_spans(capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setenv("RADIXGATE_TRACE_CONSOLE", "1")
    provider = build_tracer_provider()
    with provider.get_tracer("test").start_as_current_span("printed"):
        pass
    provider.shutdown()
    assert '"name": "printed"' in capsys.readouterr().out


def test_no_exporter_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    provider = build_tracer_provider(TracingConfig())
    with provider.get_tracer("test").start_as_current_span("dropped") as span:
        assert span.get_span_context().is_valid  # spans still carry context for propagation
    provider.shutdown()
    assert capsys.readouterr().out == ""
