"""Which prefix-cache namespace a turn's KV lives in, and what an operator shares across tenants.

    namespace    derived here, server-side, from (model, tenant, cache_salt): a BLAKE2b hash over
                 length-prefixed fields, so ("org_1", "2345") and ("org_12345", "") differ and
                 no client input alone names a namespace. The tenant is the authenticated API
                 key's; the salt (`cache_salt` on every route) only splits a tenant's namespace
                 further: it is hashed under the tenant, so it never selects another tenant's.
    shared       the operator's public prefix (`radixgate serve --shared-prefix-file`,
                 RADIXGATE_SHARED_PREFIX): a system prompt, rendered once to token ids. A turn
                 whose full token path starts with (part of) it declares that part public
                 (`Extend.shared_prefix_len`); the engine shares those whole pages across
                 namespaces and keeps the rest per namespace (`engine.scheduler.shared_prefix`).

The engine only ever sees the hash. Everything it keys by namespace splits per tenant and salt
with it: the radix trees, the host and disk tiers' page keys, the routing probe, the drafters'
per-namespace history. No metric is labelled by namespace (nor by tenant).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.rendering import TurnRenderer
    from gateway.settings import GatewaySettings

MAX_CACHE_SALT_LEN = 128
_TAG = b"radixgate-cache-namespace-v1"


def cache_namespace(model: str, tenant: str, cache_salt: str | None = None) -> str:
    """The engine namespace of `tenant`'s turns on `model`, split by `cache_salt` (None and ""
    are the tenant's default namespace). 32 hex characters."""
    digest = hashlib.blake2b(_TAG, digest_size=16)
    for part in (model, tenant, cache_salt or ""):
        data = part.encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def check_cache_salt(value: str | None) -> str | None:
    """`value` if it is a valid `cache_salt` (1-128 characters, no NUL) or None; else raises
    ValueError (a pydantic validator's 400)."""
    if value is None:
        return None
    if not 1 <= len(value) <= MAX_CACHE_SALT_LEN:
        raise ValueError(f"cache_salt must be 1-{MAX_CACHE_SALT_LEN} characters")
    if "\x00" in value:
        raise ValueError("cache_salt must not contain NUL")
    return value


# The `cache_salt` field of every request model: a validation error (400) when invalid.
CacheSalt = Annotated[str | None, AfterValidator(check_cache_salt)]


@dataclass(frozen=True)
class SharedPrefix:
    """The operator's public prefix as token ids (empty: nothing is shared)."""

    token_ids: tuple[int, ...] = ()

    def shared_len(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of a full token path are the public prefix's."""
        limit = min(len(self.token_ids), len(token_ids))
        num_common = 0
        while num_common < limit and token_ids[num_common] == self.token_ids[num_common]:
            num_common += 1
        return num_common


def shared_prefix_of(settings: GatewaySettings, renderer: TurnRenderer) -> SharedPrefix:
    """The declared public prefix rendered as a session's root would be (the system prompt, no
    tools). Raises ConfigError when its file cannot be read."""
    try:
        text = settings.shared_prefix_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the shared prefix file: {exc}") from exc
    return SharedPrefix(tuple(renderer.system_token_ids(text))) if text else SharedPrefix()
