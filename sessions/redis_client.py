"""The one place that turns a store URL into a Redis client: a single server or a cluster.

URL forms (`--redis-url`, `RADIXGATE_REDIS_URL`):

    redis://[user:pass@]host:port[/db]           one Redis / Valkey server (`redis.asyncio.Redis`)
    rediss://...                                 the same over TLS
    redis+cluster://[user:pass@]h1:p1[,h2:p2...]  a Redis / Valkey Cluster, given by seed nodes
    rediss+cluster://...                         the same over TLS
    redis://h1:p1,h2:p2[,...]                    several seed nodes: also a cluster

A cluster gets `redis.asyncio.cluster.RedisCluster`, which follows MOVED and ASK, retries
TRYAGAIN, and refreshes its slot map after a failover; scripts registered on it are loaded on
every primary after NOSCRIPT. A cluster has only database 0, so a `/db` other than 0 is refused.
Query options are not read (a URL with any is refused, rather than silently ignored).
"""

from __future__ import annotations

from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit

import redis
import redis.cluster
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    ClusterDownError,
    RedisClusterUnreachableError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

StoreClient: TypeAlias = Redis | RedisCluster
"""What the stores take: one server or a cluster (both speak the commands the stores use)."""

SyncStoreClient: TypeAlias = redis.Redis | redis.cluster.RedisCluster

# Error replies of a server that is up but cannot serve yet: loading its AOF, a replica not yet
# promoted (READONLY, MASTERDOWN), a cluster in failover (CLUSTERDOWN) or resharding (TRYAGAIN).
_OUTAGE_CODES = frozenset({"LOADING", "BUSY", "MISCONF", "READONLY", "OOM", "TRYAGAIN",
                           "MASTERDOWN", "CLUSTERDOWN"})
_CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  # scheme -> TLS
_DEFAULT_PORT = 6379


class StoreUrlError(ValueError):
    """A store URL that cannot be used (the message says why)."""


def is_cluster_url(url: str) -> bool:
    """True when `url` names a cluster: a `+cluster` scheme, or several seed nodes."""
    parts = urlsplit(url)
    return parts.scheme in _CLUSTER_SCHEMES or "," in parts.netloc


def seed_nodes(url: str) -> list[tuple[str, int]]:
    """The (host, port) seed nodes of a cluster URL. Raises StoreUrlError."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    seeds = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = item.strip(), str(_DEFAULT_PORT)
        if not host or not port.isdigit():
            raise StoreUrlError(f"bad seed node {item!r} in the cluster URL (want host:port)")
        seeds.append((host.strip("[]"), int(port)))
    return seeds


def _cluster_kwargs(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.query:
        raise StoreUrlError("cluster URLs take no query options")
    if parts.path.strip("/") not in ("", "0"):
        raise StoreUrlError("a cluster has only database 0")
    kwargs: dict[str, Any] = {}
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        user, has_password, password = userinfo.partition(":")
        kwargs["username"] = unquote(user) or None
        kwargs["password"] = unquote(password) if has_password else None
    if _CLUSTER_SCHEMES.get(parts.scheme, parts.scheme == "rediss"):
        kwargs["ssl"] = True
    return kwargs


def open_client(url: str, *, decode_responses: bool = False, **options: Any) -> StoreClient:
    """A client for `url` (see the module docstring); connects lazily, on its first command.
    `options` go to the client's constructor (timeouts and the like).
    Raises StoreUrlError for a cluster URL that cannot be used."""
    if not is_cluster_url(url):
        client: Redis = Redis.from_url(url, decode_responses=decode_responses, **options)
        return client
    nodes = [ClusterNode(host, port) for host, port in seed_nodes(url)]
    return RedisCluster(startup_nodes=nodes, decode_responses=decode_responses,
                        **_cluster_kwargs(url), **options)


def open_sync_client(url: str, **options: Any) -> SyncStoreClient:
    """The blocking twin of `open_client` (for tools and tests)."""
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **options)
    nodes = [redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
             for host, port in seed_nodes(url)]
    return redis.cluster.RedisCluster(startup_nodes=nodes, **_cluster_kwargs(url), **options)


def decodes_responses(client: StoreClient) -> bool:
    """True when the client answers str rather than bytes."""
    return bool(client.get_encoder().decode_responses)


async def ping(client: StoreClient) -> None:
    """One round trip to the store (on a cluster, after learning its slot map). Raises the
    client's error (ConnectionError, RedisClusterException...) when it cannot be reached."""
    if isinstance(client, RedisCluster):
        await client.initialize()
    await client.ping()


def is_store_outage(exc: BaseException) -> bool:
    """True for an error that means the store is down or not ready (a connection error, a
    timeout, LOADING, a cluster whose slot has no primary yet during a failover...), as opposed
    to a bug in a command (a wrong type, CROSSSLOT)."""
    if isinstance(exc, SlotNotCoveredError | RedisClusterUnreachableError):
        return True  # not RedisErrors: the cluster client's own "no node serves this slot"
    if not isinstance(exc, RedisError):
        return False
    if isinstance(exc, ClusterDownError | TryAgainError):
        return True
    if isinstance(exc, ResponseError):
        # redis-py strips the error code from the message and keeps it in `status_code`.
        code = getattr(exc, "status_code", None) or str(exc).partition(" ")[0]
        return code in _OUTAGE_CODES
    return True
