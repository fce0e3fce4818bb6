"""Acknowledging a write only once a replica has it: `WAIT numreplicas timeout` after the script.

Redis and Valkey replicate asynchronously, so a primary that dies right after answering can take
an acknowledged write with it when its replica is promoted. With `Durability(num_replicas=N)`
the session store follows each mutation script with `WAIT N <timeout_ms>` on the same connection
(one pipeline, one round trip; on a cluster the WAIT is sent to the node that owns the session's
slot, which is where the script ran), and treats an answer below N as a failed write
(`NotReplicated`, a store outage: 503 `store_unavailable` with Retry-After). The gateway's commit
retries through an outage and is idempotent, so a write that did land is answered from its
record rather than applied twice.

Why WAIT and not WAITAOF: what a failover loses is what the replica does not have; WAIT waits
exactly for that (the replica acknowledges the replication offset), whatever the nodes' fsync
policy. WAITAOF waits for an fsync of the AOF, which protects against a whole-machine power loss
but not against a promotion of a replica that never received the write, and it fails outright on
nodes without appendonly. Neither makes the store strongly consistent (the Redis docs say so):
WAIT narrows the window to writes the replica received but a partition then kept it from serving.

A replayed mutation (DUP: the idempotency record of a first try that did land) writes nothing, so
its WAIT covers only what this connection wrote before; that first write may still be on the
primary alone. This is the one case acknowledged without a confirmation of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from sessions.redis_client import StoreClient


class NotReplicated(RedisError):
    """A write was made on the primary but fewer replicas than required acknowledged it in
    time (or the answer was redirected to another node). It may or may not survive a failover;
    a retry of the same idempotent request settles it."""


@dataclass(frozen=True)
class Durability:
    """How many replicas must hold a mutation before it is acknowledged (0: none, no WAIT) and
    how long to wait for them."""

    num_replicas: int = 0
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if self.num_replicas < 0 or self.timeout_ms <= 0:
            raise ValueError("num_replicas must be >= 0 and timeout_ms > 0")

    @property
    def enabled(self) -> bool:
        return self.num_replicas > 0


NO_WAIT = Durability()


def default_durability(client: StoreClient, num_replicas: int | None = None,
                       timeout_ms: int = 1000) -> Durability:
    """`num_replicas` when given, else 1 on a cluster (each primary has a replica that takes
    over) and 0 on a single server (which may have no replica at all)."""
    if num_replicas is None:
        num_replicas = 1 if isinstance(client, RedisCluster) else 0
    return Durability(num_replicas, timeout_ms)


def _pipeline(client: StoreClient) -> Pipeline | ClusterPipeline:
    if isinstance(client, RedisCluster):
        return client.pipeline()
    return client.pipeline(transaction=False)


async def _node_of(client: StoreClient, key: str) -> ClusterNode | None:
    if not isinstance(client, RedisCluster):
        return None
    await client.initialize()  # the slot map (a no-op once known)
    return client.get_node_from_key(key)


async def run_durably(client: StoreClient, script: AsyncScript, keys: Sequence[str],
                      args: Sequence[Any], durability: Durability,
                      extra: Sequence[Sequence[Any]] = ()) -> tuple[Any, list[Any]]:
    """Run `script` (its keys all in `keys[0]`'s slot), then WAIT as `durability` says, in one
    round trip; `extra` commands (each a raw command, on any slot, not waited for) ride along.
    Returns (the script's reply, the extra commands' replies or exceptions).

    Only a reply whose first element is b"OK" or b"DUP" is waited for (other status words wrote
    nothing). Raises NotReplicated, or the script's error (a connection error, CLUSTERDOWN...).
    A NOSCRIPT (a restarted or promoted node) loads the script and runs it again, once."""
    for attempt in (0, 1):
        node = await _node_of(client, keys[0])
        async with _pipeline(client) as pipe:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            if durability.enabled:
                wait = ("WAIT", durability.num_replicas, durability.timeout_ms)
                if node is not None:
                    pipe.execute_command(*wait, target_nodes=node)
                else:
                    pipe.execute_command(*wait)
            for command in extra:
                pipe.execute_command(*command)
            replies = await pipe.execute(raise_on_error=False)
        reply = replies[0]
        if isinstance(reply, NoScriptError) and attempt == 0:
            await client.script_load(script.script)
            continue
        if isinstance(reply, Exception):
            raise reply
        rest = replies[1:]
        if durability.enabled:
            acked, rest = rest[0], rest[1:]
            if reply and reply[0] in (b"OK", b"DUP"):
                await _check_acked(client, keys[0], node, acked, durability)
        return reply, list(rest)
    raise AssertionError("unreachable: the second attempt returns or raises")


async def _check_acked(client: StoreClient, key: str, node: ClusterNode | None, acked: Any,
                       durability: Durability) -> None:
    if isinstance(acked, Exception):
        raise acked
    if node is not None and await _node_of(client, key) is not node:
        # The script was redirected (MOVED/ASK) after the WAIT was routed: it counted
        # another connection's writes.
        raise NotReplicated("the write moved to another node before it was confirmed")
    if int(acked) < durability.num_replicas:
        raise NotReplicated(f"{acked} of {durability.num_replicas} replica(s) acknowledged "
                            f"the write within {durability.timeout_ms} ms")
