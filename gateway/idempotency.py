"""`Idempotency-Key` for gateway POSTs: a replay returns the first response.

One record per (tenant, key) under `{prefix}gw:idem:`:

    P<hash><token>             the first request is running (a retry gets 409 `conflict`)
    D<hash>\\n<status>\\n<json>   it finished: a retry gets this response
    R<hash>\\n<json>             a stream was interrupted (its engine worker died): the first
                               retry claims it (back to P) and continues the turn from the state

Same key + same request hash → the outcome above; a different request hash → 422
`idempotency_conflict`. Failed requests drop their record, so a retry runs again.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.commands.core import AsyncScript

from gateway.errors import InFlight, InvalidRequest
from gateway.store_retry import through_store_outage
from sessions.errors import IdempotencyConflict
from sessions.redis_client import StoreClient

IDEMPOTENCY_TTL_S = 24 * 3600
# A running request's claim lapses after this, so a gateway that died mid-request does not hold
# its key for a day (no turn runs this long: engine_timeout_s bounds each engine message).
IN_FLIGHT_TTL_S = 3600
_MAX_KEY_LEN = 200

# KEYS[1] record; ARGV[1] request hash, ARGV[2] TTL, ARGV[3] this attempt's token. A new or
# interrupted record becomes "P<hash><token>"; finding our own token again means an earlier
# try of this very claim landed but its reply was lost (the store died): still ours.
_CLAIM = """
local cur = redis.call('GET', KEYS[1])
local mine = 'P' .. ARGV[1] .. ARGV[3]
if not cur or cur == mine then
  redis.call('SET', KEYS[1], mine, 'EX', ARGV[2])
  return {'NEW', ''}
end
if string.sub(cur, 2, 65) ~= ARGV[1] then return {'CONFLICT', ''} end
local kind = string.sub(cur, 1, 1)
if kind == 'R' then redis.call('SET', KEYS[1], mine, 'EX', ARGV[2]) end
return {kind, cur}
"""


def request_hash(method: str, path: str, body: Any) -> str:
    raw = json.dumps([method, path, body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    """This request runs; it must end its record with `finish`, `interrupt` or `abandon`.
    `state` is an interrupted earlier run's (to continue from), else None."""

    rkey: str
    req_hash: str
    state: dict[str, Any] | None = None


@dataclass(frozen=True)
class Replay:
    """The first request with this key finished: answer its response."""

    status: int
    body: Any


class IdempotencyStore:
    def __init__(self, redis: StoreClient, prefix: str) -> None:
        self.redis = redis
        self.prefix = f"{prefix}gw:idem:"
        self._claim: AsyncScript = redis.register_script(_CLAIM)

    async def run(self, tenant: str, key: str | None, req_hash: str,
                  compute: Callable[[], Awaitable[tuple[int, Any]]]) -> tuple[int, Any]:
        """(status, JSON body) of `compute()`, or of its first run under `key`.

        Raises InvalidRequest (bad key), InFlight (409), IdempotencyConflict (422)."""
        if key is None:
            return await compute()
        outcome = await self.claim(tenant, key, req_hash)
        if isinstance(outcome, Replay):
            return outcome.status, outcome.body
        try:
            status, body = await compute()
        except BaseException:
            await self.abandon(outcome)
            raise
        await self.finish(outcome, status, body)
        return status, body

    def record_key(self, tenant: str, key: str) -> str:
        """The Redis key of (tenant, Idempotency-Key). Raises InvalidRequest (bad key)."""
        if not key or len(key) > _MAX_KEY_LEN or not key.isprintable():
            raise InvalidRequest(f"Idempotency-Key must be 1-{_MAX_KEY_LEN} printable characters")
        return f"{self.prefix}{tenant}:{hashlib.sha256(key.encode()).hexdigest()}"

    async def claim(self, tenant: str, key: str, req_hash: str) -> Claim | Replay:
        """Take `key` for this request, or learn how its first request ended.
        Raises InvalidRequest (bad key), InFlight (409), IdempotencyConflict (422)."""
        rkey = self.record_key(tenant, key)
        token = secrets.token_hex(16)
        kind, raw = await through_store_outage(
            lambda: self._claim(keys=[rkey], args=[req_hash, IN_FLIGHT_TTL_S, token]))
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        record = raw.decode() if isinstance(raw, bytes) else str(raw)
        if kind == "NEW":
            return Claim(rkey, req_hash)
        if kind == "CONFLICT":
            raise IdempotencyConflict(None)
        if kind == "P":
            raise InFlight("a request with this Idempotency-Key is still in flight")
        if kind == "R":
            state: dict[str, Any] = json.loads(record.split("\n", 1)[1])
            return Claim(rkey, req_hash, state)
        _, status, body = record.split("\n", 2)
        return Replay(int(status), json.loads(body))

    # A claim's end rides out a store restart: left as "P", the key would answer 409 to
    # every retry until IN_FLIGHT_TTL_S ran out.

    async def finish(self, claim: Claim, status: int, body: Any) -> None:
        """Record the response that every retry with this key gets."""
        record = f"D{claim.req_hash}\n{status}\n{json.dumps(body)}"
        await through_store_outage(lambda: self.redis.set(claim.rkey, record,
                                                          ex=IDEMPOTENCY_TTL_S))

    async def interrupt(self, claim: Claim, state: dict[str, Any]) -> None:
        """Keep `state` for the retry that continues this request."""
        record = f"R{claim.req_hash}\n{json.dumps(state)}"
        await through_store_outage(lambda: self.redis.set(claim.rkey, record,
                                                          ex=IDEMPOTENCY_TTL_S))

    async def abandon(self, claim: Claim) -> None:
        """The request failed: free the key, so a retry runs again."""
        await through_store_outage(lambda: self.redis.delete(claim.rkey))
