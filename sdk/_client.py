"""`Client` and `AsyncClient`: thin twins over httpx. Everything that is not I/O lives in
`sdk._base` (requests, retry policy, parsing); the twins differ only in `async`/`await`."""

from __future__ import annotations

import asyncio
import os
import time
from types import TracebackType
from typing import TypeVar

import httpx
from pydantic import BaseModel

from sdk._base import (
    RequestOptions,
    build_request,
    default_headers,
    retry_decision,
    transport_error,
)
from sdk._constants import DEFAULT_BASE_URL, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from sdk._errors import error_from_response
from sdk._resources import AsyncSessions, Sessions

ModelT = TypeVar("ModelT", bound=BaseModel)


def _resolve(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """Arguments win over `RADIXGATE_BASE_URL` / `RADIXGATE_API_KEY`."""
    url = base_url or os.environ.get("RADIXGATE_BASE_URL") or DEFAULT_BASE_URL
    return url.rstrip("/"), api_key or os.environ.get("RADIXGATE_API_KEY") or None


class Client:
    """Synchronous radixgate client. Use as a context manager or call `close()`."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
                 max_retries: int = DEFAULT_MAX_RETRIES,
                 http_client: httpx.Client | None = None) -> None:
        self.base_url, self.api_key = _resolve(base_url, api_key)
        self.max_retries = max_retries
        self._http = http_client or httpx.Client(timeout=timeout)
        self._http.base_url = httpx.URL(self.base_url)
        self._http.headers.update(default_headers(self.api_key))
        self.sessions = Sessions(self)

    def request(self, options: RequestOptions) -> httpx.Response:
        """Send with retries. Non-stream responses are read; stream responses are returned open
        (the caller closes them). Raises APIStatusError subclasses or APIConnectionError."""
        attempt = 0
        while True:
            request = build_request(self._http, options)
            try:
                response = self._http.send(request, stream=options.stream)
            except httpx.TransportError as exc:
                delay = retry_decision(attempt, self.max_retries, None, None)
                if delay is None:
                    raise transport_error(exc, request) from exc
            else:
                if response.is_success:
                    return response
                response.read()
                response.close()
                delay = retry_decision(attempt, self.max_retries, response.status_code,
                                       response.headers)
                if delay is None:
                    raise error_from_response(response)
            time.sleep(delay)
            attempt += 1

    def request_model(self, options: RequestOptions, model: type[ModelT]) -> ModelT:
        return model.model_validate_json(self.request(options).content)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AsyncClient:
    """Asynchronous twin of `Client`."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
                 max_retries: int = DEFAULT_MAX_RETRIES,
                 http_client: httpx.AsyncClient | None = None) -> None:
        self.base_url, self.api_key = _resolve(base_url, api_key)
        self.max_retries = max_retries
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._http.base_url = httpx.URL(self.base_url)
        self._http.headers.update(default_headers(self.api_key))
        self.sessions = AsyncSessions(self)

    async def request(self, options: RequestOptions) -> httpx.Response:
        """See `Client.request`."""
        attempt = 0
        while True:
            request = build_request(self._http, options)
            try:
                response = await self._http.send(request, stream=options.stream)
            except httpx.TransportError as exc:
                delay = retry_decision(attempt, self.max_retries, None, None)
                if delay is None:
                    raise transport_error(exc, request) from exc
            else:
                if response.is_success:
                    return response
                await response.aread()
                await response.aclose()
                delay = retry_decision(attempt, self.max_retries, response.status_code,
                                       response.headers)
                if delay is None:
                    raise error_from_response(response)
            await asyncio.sleep(delay)
            attempt += 1

    async def request_model(self, options: RequestOptions, model: type[ModelT]) -> ModelT:
        return model.model_validate_json((await self.request(options)).content)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
