"""Shared pytest fixtures. Each section belongs to one area; add new sections below, don't mix."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# The model a `--model`-less load or serve runs in tests: the fast SmolLM2-135M, not the default
# Qwen2.5-Coder-1.5B (engine.models.locate). Set before anything imports the engine, so that
# every process a test starts inherits it; tests of the real model name it.
os.environ.setdefault("RADIXGATE_MODEL", "smollm2-135m")

# ==== Redis / Valkey (owner: sessions) ===========================================================
# `redis_url`: a real server for the whole test session. Order: $RADIXGATE_TEST_REDIS_URL, else the
# server on 127.0.0.1:6379 if it answers PING, else an EmbeddedValkey in a temporary directory.
# The server may be shared (CI, other developers): tests must write under `redis_key_prefix`,
# which is unique per test and whose keys are all deleted afterwards.

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


def _answers_ping(url: str) -> bool:
    import redis  # deferred: this conftest is loaded by every test package, even redis-free ones

    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real Redis/Valkey server for this test session (see the section comment)."""
    url = os.environ.get("RADIXGATE_TEST_REDIS_URL")
    if url:
        yield url
        return
    if _answers_ping(LOCAL_REDIS_URL):
        yield LOCAL_REDIS_URL
        return
    from sessions.embedded import EmbeddedValkey

    data_dir: Path = tmp_path_factory.mktemp("valkey")
    with EmbeddedValkey(data_dir) as server:
        yield server.url


@pytest.fixture
def redis_key_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix `test:<uuid>:` (no braces: they would steal the hash tag). Every key
    under it is deleted after the test, whatever the test left behind."""
    from tests.redis_keys import delete_key_prefix  # deferred like `redis` above

    prefix = f"test:{uuid.uuid4().hex}:"
    yield prefix
    delete_key_prefix(redis_url, prefix)


# ==== end Redis / Valkey ==========================================================================
