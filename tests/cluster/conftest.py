"""Fixtures of the cluster tests: a real 3-primary, 3-replica Valkey Cluster for the session.

Inside tests/cluster, `redis_url` is the cluster's `redis+cluster://` URL, so the suites of the
other packages that are re-run here (their fixtures are imported below) talk to the cluster
through the same factory as the gateway (`sessions.redis_client.open_client`). The session
store of `with_store` acknowledges every mutation only after `WAIT 1` (`sessions.durability`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from sessions.durability import Durability
from tests.cluster.local_cluster import LocalCluster
from tests.compat.conftest import live as live  # re-exported: the compat suite runs here too
from tests.gateway.conftest import run_gateway as run_gateway
from tests.gateway.conftest import tiny_loaded as tiny_loaded
from tests.gateway.conftest import tokenizer as tokenizer
from tests.sessions.conftest import StoreBody
from tests.sessions.support import open_store

WAIT_ONE = Durability(num_replicas=1, timeout_ms=2000)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The shared cluster (tests that kill nodes start their own `LocalCluster`)."""
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_url(redis_cluster: LocalCluster) -> str:
    return redis_cluster.url


@pytest.fixture
def with_store(redis_url: str, redis_key_prefix: str) -> Callable[[StoreBody], None]:
    """tests/sessions' `with_store`, on the cluster, with WAIT after each mutation."""

    def run(body: StoreBody) -> None:
        async def main() -> None:
            async with open_store(redis_url, redis_key_prefix, durability=WAIT_ONE) as store:
                await body(store)

        asyncio.run(main())

    return run
