"""The store-client factory: which URLs name a cluster, and which errors are an outage."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    ClusterCrossSlotError,
    ClusterDownError,
    ReadOnlyError,
    RedisClusterException,
    RedisClusterUnreachableError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from gateway.errors import status_for
from sessions.durability import NotReplicated
from sessions.redis_client import (
    StoreUrlError,
    is_cluster_url,
    is_store_outage,
    open_client,
    seed_nodes,
)


def test_cluster_urls_and_seed_nodes() -> None:
    assert is_cluster_url("redis+cluster://a:7000,b:7001")
    assert is_cluster_url("rediss+cluster://a:7000")
    assert is_cluster_url("redis://a:7000,b:7001")
    assert not is_cluster_url("redis://127.0.0.1:6379/0")
    assert seed_nodes("redis+cluster://u:p@a:7000, b:7001,[::1]:7002") == [
        ("a", 7000), ("b", 7001), ("::1", 7002)]
    assert isinstance(open_client("redis://127.0.0.1:6379/0"), Redis)
    client = open_client("rediss+cluster://user:secret@127.0.0.1:7000")
    assert isinstance(client, RedisCluster)


@pytest.mark.parametrize("url", ["redis+cluster://a:7000/3", "redis+cluster://a:x",
                                 "redis+cluster://a:7000?timeout=1"])
def test_unusable_cluster_urls_are_refused(url: str) -> None:
    with pytest.raises(StoreUrlError):
        open_client(url)


@pytest.mark.parametrize(("exc", "outage"), [
    (ClusterDownError("The cluster is down"), True),
    (TryAgainError("Multiple keys request during rehashing of slot"), True),
    (ReadOnlyError("You can't write against a read only replica.", status_code="READONLY"), True),
    (SlotNotCoveredError('Slot "12" is not covered by the cluster.'), True),
    (RedisClusterUnreachableError("no node answered"), True),
    (NotReplicated("0 of 1 replica(s) acknowledged the write within 1000 ms"), True),
    (ClusterCrossSlotError("Keys in request don't hash to the same slot"), False),
    (RedisClusterException("unsupported command"), False),
    (ResponseError("ERR Error running script"), False),
])
def test_cluster_outages_are_typed_503s(exc: Exception, outage: bool) -> None:
    assert is_store_outage(exc) is outage
    assert status_for(exc) == ((503, "store_unavailable") if outage else (500, "api_error"))
