"""Helpers shared by the sessions tests (no fixtures: those live in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sessions import NewTurn, SessionStore
from sessions.redis_client import open_client


@asynccontextmanager
async def open_store(url: str, prefix: str, **kwargs: Any) -> AsyncIterator[SessionStore]:
    """A SessionStore on its own client, closed on exit (call inside the test's event loop)."""
    client = open_client(url)  # one server or a cluster (tests/cluster)
    try:
        yield SessionStore(client, key_prefix=prefix, **kwargs)
    finally:
        await client.aclose()


async def keys_matching(store: SessionStore, pattern: str) -> list[str]:
    """Every key name matching a SCAN glob pattern, sorted."""
    return sorted([k.decode() async for k in store.redis.scan_iter(match=pattern, count=1000)])


def user(*token_ids: int, text: str = "hi") -> NewTurn:
    """An input turn with one user message."""
    return NewTurn("user", token_ids, messages=[{"role": "user", "content": text}])


def assistant(*token_ids: int, text: str = "ok") -> NewTurn:
    """An assistant turn that finished with `stop`."""
    return NewTurn(
        "assistant",
        token_ids,
        messages=[{"role": "assistant", "content": text}],
        usage={"output_tokens": len(token_ids)},
        finish_reason="stop",
    )
