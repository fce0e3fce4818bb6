"""API keys and tenants. Only sha256(key) is stored; the key itself is shown once at creation.

Redis layout (under `settings.auth_key_prefix`): `key:<sha256 hex>` → tenant name, and the set
`keys` of every stored hash (so "is any key configured?" is one SCARD).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from redis.asyncio import Redis

from gateway.errors import AuthenticationError, InvalidRequest

LOCAL_TENANT = "local"
_TENANT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_credentials(authorization: str | None, x_api_key: str | None) -> str | None:
    """The presented key from `Authorization: Bearer KEY` or `x-api-key: KEY`, else None."""
    if x_api_key:
        return x_api_key.strip()
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthenticationError("the Authorization header must be 'Bearer <key>'")
        return value.strip()
    return None


class KeyStore:
    """Create and resolve API keys. Stateless besides the Redis client."""

    def __init__(self, redis: Redis, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix

    async def create(self, tenant: str) -> str:
        """Store a new key for `tenant` and return it (the only time it is visible).

        Raises InvalidRequest on a bad tenant name."""
        if not _TENANT_RE.match(tenant):
            raise InvalidRequest("tenant names are 1-64 characters of [A-Za-z0-9_.-]")
        key = "rg-" + secrets.token_urlsafe(32)
        digest = hash_key(key)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(f"{self.prefix}key:{digest}", tenant)
            pipe.sadd(f"{self.prefix}keys", digest)
            await pipe.execute()
        return key

    async def has_keys(self) -> bool:
        return bool(await self.redis.scard(f"{self.prefix}keys"))

    async def tenant_of(self, key: str | None, *, open_access: bool) -> str:
        """The tenant of `key`. With no key presented: LOCAL_TENANT when `open_access` and no key
        exists, else AuthenticationError. A wrong key is always an AuthenticationError."""
        if key is None:
            if open_access and not await self.has_keys():
                return LOCAL_TENANT
            raise AuthenticationError("an API key is required (Authorization: Bearer or x-api-key)")
        digest = hash_key(key)
        stored = await self.redis.get(f"{self.prefix}key:{digest}")
        # The lookup is by hash, so timing reveals nothing of the key; compare anyway for clarity.
        if stored is None or not hmac.compare_digest(digest, hash_key(key)):
            raise AuthenticationError("invalid API key")
        return stored.decode() if isinstance(stored, bytes) else str(stored)
