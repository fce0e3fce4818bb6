"""API keys and tenants. Only sha256(key) is stored; the key itself is shown once at creation.

Redis layout (under `settings.auth_key_prefix`): `key:<sha256 hex>` → tenant name, and the set
`keys` of every stored hash (so "is any key configured?" is one SCARD). On a cluster the two are
in different slots; `create` writes them in an order that fails closed.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from gateway.errors import AuthenticationError, InvalidRequest
from sessions.redis_client import StoreClient

LOCAL_TENANT = "local"
_TENANT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_credentials(authorization: str | None, x_api_key: str | None) -> str | None:
    """The presented key from `Authorization: Bearer KEY` or `x-api-key: KEY`, else None.
    Raises AuthenticationError for another Authorization scheme."""
    if x_api_key:
        return x_api_key.strip()
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthenticationError("the Authorization header must be 'Bearer <key>'")
        return value.strip()
    return None


MAX_CACHED_KEYS = 4096


class KeyStore:
    """Create and resolve API keys. Remembers the keys it has resolved: a stored key's tenant
    never changes (keys are not revoked), so a known key costs no round trip."""

    def __init__(self, redis: StoreClient, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self._known: OrderedDict[str, str] = OrderedDict()  # key digest -> tenant

    async def create(self, tenant: str) -> str:
        """Store a new key for `tenant` and return it (the only time it is visible).

        Raises InvalidRequest on a bad tenant name."""
        if not _TENANT_RE.match(tenant):
            raise InvalidRequest("tenant names are 1-64 characters of [A-Za-z0-9_.-]")
        key = "rg-" + secrets.token_urlsafe(32)
        digest = hash_key(key)
        # Two keys in two cluster slots, so no transaction: the set first, then the key. Cut
        # off between the two, the set says keys are enforced while the key does not resolve
        # yet (closed, never open), and both writes are idempotent.
        await self.redis.sadd(f"{self.prefix}keys", digest)
        await self.redis.set(f"{self.prefix}key:{digest}", tenant)
        return key

    async def has_keys(self) -> bool:
        return bool(await self.redis.scard(f"{self.prefix}keys"))

    async def tenant_of(self, key: str | None, policy: AccessPolicy) -> str:
        """The tenant of a presented `key` (None: no key) under `policy` (`principal_of`)."""
        return (await self.principal_of(key, policy)).tenant

    async def principal_of(self, key: str | None, policy: AccessPolicy) -> Principal:
        """The tenant of a presented `key` (None: no key) under `policy`, in one round trip,
        with the key's digest when it is a stored key (its own limits apply).

        Open access (no `policy.api_key`, no stored key, `policy.allow_open`): every request is
        LOCAL_TENANT, whatever key it presents, as vLLM and llama.cpp serve any key when started
        without one. Otherwise the key must be `policy.api_key` (LOCAL_TENANT) or a stored key;
        anything else raises AuthenticationError."""
        if policy.api_key is not None and key is not None and hmac.compare_digest(
                hash_key(key), hash_key(policy.api_key)):
            return Principal(LOCAL_TENANT)
        digest = hash_key(key) if key is not None else ""
        known = self._known.get(digest)
        if known is not None:
            self._known.move_to_end(digest)
            return Principal(known, digest)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(f"{self.prefix}key:{digest}")
            pipe.scard(f"{self.prefix}keys")
            stored, num_keys = await pipe.execute()
        if stored is not None and key is not None:
            tenant = stored.decode() if isinstance(stored, bytes) else str(stored)
            self._known[digest] = tenant
            if len(self._known) > MAX_CACHED_KEYS:
                self._known.popitem(last=False)
            return Principal(tenant, digest)
        if policy.api_key is None and not num_keys and policy.allow_open:
            return Principal(LOCAL_TENANT)
        if key is None:
            raise AuthenticationError("an API key is required (Authorization: Bearer or x-api-key)")
        raise AuthenticationError("invalid API key")


@dataclass(frozen=True)
class Principal:
    """Who a request is: its tenant, and the digest of its stored API key (None: no stored
    key, e.g. open access or the `--api-key` key)."""

    tenant: str
    key_digest: str | None = None

    def subjects(self) -> list[str]:
        """Hash-tag subjects the request is limited under, key first."""
        return ([f"key:{self.key_digest}"] if self.key_digest else []) + [
            f"tenant:{self.tenant}"]


@dataclass(frozen=True)
class AccessPolicy:
    """Who may call. `api_key`: a key given at start (`--api-key`), which enforces keys even
    when none is stored. `allow_open`: open access is allowed at all (a loopback host, or
    `--insecure`); it is in effect while no key is stored."""

    api_key: str | None
    allow_open: bool
