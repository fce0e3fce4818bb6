"""Fixtures of the sessions tests. The Redis server and key prefix come from tests/conftest.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sessions import SessionStore
from tests.sessions.support import open_store

StoreBody = Callable[[SessionStore], Awaitable[None]]


@pytest.fixture
def with_store(redis_url: str, redis_key_prefix: str) -> Callable[[StoreBody], None]:
    """Run an async test body with a SessionStore under the test's key prefix, in a fresh loop.

    (No pytest-asyncio in the dev dependencies: each test owns one `asyncio.run`.)
    """

    def run(body: StoreBody) -> None:
        async def main() -> None:
            async with open_store(redis_url, redis_key_prefix) as store:
                await body(store)

        asyncio.run(main())

    return run
