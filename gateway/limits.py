"""Pure-ASGI middleware: a request id on every request, and the body-size limit (413).

The limit checks `Content-Length` up front and counts streamed bytes, so a chunked body cannot
slip past it.
"""

from __future__ import annotations

import json
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import Dialect, RequestTooLarge, dialect_of, wire_error


class RequestLimits:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        request_id = headers.get(b"x-request-id", b"").decode("latin-1")[:128] or (
            "req_" + uuid.uuid4().hex)
        scope.setdefault("state", {})["request_id"] = request_id
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            names = {k.decode("latin-1").lower(): "" for k in headers}
            await self._reject(send, request_id, dialect_of(scope.get("path", ""), names))
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise RequestTooLarge(self._message())
            return message

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"],
                                      (b"x-request-id", request_id.encode("latin-1"))]
            await send(message)

        await self.app(scope, counting_receive, send_with_id)

    def _message(self) -> str:
        return f"the request body exceeds {self.max_body_bytes} bytes"

    async def _reject(self, send: Send, request_id: str, dialect: Dialect) -> None:
        status, error = wire_error(dialect, 413, RequestTooLarge.error_type, self._message(),
                                   request_id)
        body = json.dumps(error).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"x-request-id", request_id.encode("latin-1"))]})
        await send({"type": "http.response.body", "body": body})
