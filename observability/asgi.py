"""Pure-ASGI middleware: one SERVER span per HTTP request, continuing a W3C `traceparent`.

The span is current while the app runs (handlers' spans become its children) and ends when the
app returns, i.e. after the last body chunk of a streamed response. It is named
`{method} {route template}` once routing has matched (`POST /v1/sessions/{session_id}/turns`),
else `{method}`. Status 5xx and exceptions set the span status to ERROR.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from observability import semconv as sc

DEFAULT_EXCLUDED_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
TRACER_NAME = "radixgate.gateway"


class ServerSpanMiddleware:
    """Wrap `app`; spans come from `tracer_provider`. Requests to `excluded_paths` (exact
    match) are passed through untraced. Never raises on its own; re-raises the app's errors."""

    def __init__(self, app: ASGIApp, tracer_provider: trace.TracerProvider, *,
                 excluded_paths: Iterable[str] = DEFAULT_EXCLUDED_PATHS) -> None:
        self.app = app
        self.tracer = tracer_provider.get_tracer(TRACER_NAME)
        self.propagator = TraceContextTextMapPropagator()
        self.excluded_paths = frozenset(excluded_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.excluded_paths:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers") or []}
        parent = self.propagator.extract(headers)
        method = str(scope.get("method", "GET"))
        span = self.tracer.start_span(method, context=parent, kind=SpanKind.SERVER,
                                      attributes=_request_attributes(scope, method, headers))
        status_code: int | None = None

        async def send_with_status(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = int(message["status"])
                span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, status_code)
            await send(message)

        try:
            with trace.use_span(span, end_on_exit=False, record_exception=True,
                                set_status_on_exception=True):
                await self.app(scope, receive, send_with_status)
        finally:
            route = getattr(scope.get("route"), "path", None)
            if isinstance(route, str):
                span.update_name(f"{method} {route}")
                span.set_attribute(sc.HTTP_ROUTE, route)
            if status_code is not None and status_code >= 500:
                span.set_attribute(sc.ERROR_TYPE, str(status_code))
                span.set_status(Status(StatusCode.ERROR))
            span.end()


def _request_attributes(scope: Scope, method: str,
                        headers: dict[str, str]) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {sc.HTTP_REQUEST_METHOD: method,
                                        sc.URL_PATH: str(scope.get("path", "")),
                                        sc.URL_SCHEME: str(scope.get("scheme", "http"))}
    server = scope.get("server")
    if server:
        attributes[sc.SERVER_ADDRESS] = str(server[0])
        if server[1] is not None:
            attributes[sc.SERVER_PORT] = int(server[1])
    client = scope.get("client")
    if client:
        attributes[sc.CLIENT_ADDRESS] = str(client[0])
    if "user-agent" in headers:
        attributes[sc.USER_AGENT_ORIGINAL] = headers["user-agent"]
    return attributes
