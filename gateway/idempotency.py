"""`Idempotency-Key` for gateway POSTs: a replay returns the first response.

One record per (tenant, key) under `{prefix}gw:idem:`: "P<hash>" while the first request runs,
then "D<hash>\\n<status>\\n<json body>". Same key + same request hash → the stored response (or 409
while in flight); a different request hash → 422 `idempotency_conflict`. Failed requests drop
their record, so a retry runs again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from gateway.errors import InFlight, InvalidRequest
from sessions.errors import IdempotencyConflict

IDEMPOTENCY_TTL_S = 24 * 3600
_MAX_KEY_LEN = 200


def request_hash(method: str, path: str, body: Any) -> str:
    raw = json.dumps([method, path, body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


class IdempotencyStore:
    def __init__(self, redis: Redis, prefix: str) -> None:
        self.redis = redis
        self.prefix = f"{prefix}gw:idem:"

    async def run(self, tenant: str, key: str | None, req_hash: str,
                  compute: Callable[[], Awaitable[tuple[int, Any]]]) -> tuple[int, Any]:
        """(status, JSON body) of `compute()`, or of its first run under `key`.

        Raises InvalidRequest (bad key), InFlight (409), IdempotencyConflict (422)."""
        if key is None:
            return await compute()
        if not key or len(key) > _MAX_KEY_LEN or not key.isprintable():
            raise InvalidRequest(f"Idempotency-Key must be 1-{_MAX_KEY_LEN} printable characters")
        rkey = f"{self.prefix}{tenant}:{hashlib.sha256(key.encode()).hexdigest()}"
        if not await self.redis.set(rkey, "P" + req_hash, nx=True, ex=IDEMPOTENCY_TTL_S):
            return await self._replay(rkey, req_hash)
        try:
            status, body = await compute()
        except BaseException:
            await self.redis.delete(rkey)
            raise
        record = f"D{req_hash}\n{status}\n{json.dumps(body)}"
        await self.redis.set(rkey, record, ex=IDEMPOTENCY_TTL_S)
        return status, body

    async def _replay(self, rkey: str, req_hash: str) -> tuple[int, Any]:
        raw = await self.redis.get(rkey)
        if raw is None:
            raise InFlight("the first request with this Idempotency-Key just failed; retry")
        record = raw.decode() if isinstance(raw, bytes) else str(raw)
        if record[1:65] != req_hash:
            raise IdempotencyConflict(None)
        if record[0] == "P":
            raise InFlight("a request with this Idempotency-Key is still in flight")
        _, status, body = record.split("\n", 2)
        return int(status), json.loads(body)
