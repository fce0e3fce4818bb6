"""Redis key schema and id rules for the session store.

Every key of one session shares the `{<session_id>}` hash tag, so a session lives in one cluster
slot and one Lua script can touch all of it. With the default prefix `rg:`:

    rg:{sid}:meta          HASH    tenant, model, created_ms, version, root, default_branch,
                                   num_turns, metadata, system, tools (JSON), create_hash
    rg:{sid}:br            HASH    branch name -> head turn id
    rg:{sid}:turns         ZSET    turn id scored by seq (creation order); the session's turn index
    rg:{sid}:t:<tid>       HASH    immutable turn: parent ('' for the root), depth, seq, version,
                                   role, messages, tool_calls, usage (JSON), finish_reason,
                                   token_ids (packed <u4), num_tokens, created_ms, worker (the
                                   engine worker that generated it and holds its KV; '' none)
    rg:{sid}:ch:<tid>      ZSET    children of <tid> scored by seq
    rg:{sid}:idem:<h>      STRING  "<request sha256>\\n<result JSON>", EX = idempotency TTL;
                                   <h> = sha256(idempotency key)
    rg:{sid}:idem          ZSET    idempotency record keys scored by expiry ms (delete finds them)
    rg:{sid}:ev            STREAM  events, XADD MAXLEN ~ N
    rg:{sid}:paths         HASH    path hash -> anchor turn id (`sessions.path_index`)

Tenant-wide keys share the tenant's own tag `{tenant:<tenant>}` (one slot per tenant, never a
session's), so a script may touch all of one tenant's keys on a cluster:

    rg:{tenant:<t>}:sessions ZSET  the tenant's session ids scored by created_ms (written in the
                                   session script's round trip but not atomically with it, so
                                   it may briefly lag)
    rg:{tenant:<t>}:paths    HASH  path hash -> session id (`sessions.path_index`)

Before the tag these were `rg:t:<tenant>:sessions` and `rg:t:<tenant>:paths`; stores written
then keep their sessions, but their listings and tenant-wide path entries are under the old
names: RENAME each old key to its new name (on the single server, before moving to a cluster).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Final

from sessions.errors import InvalidTreeOperation

_ID_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
_BRANCH_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
MAX_IDEMPOTENCY_KEY_LEN: Final[int] = 255


def new_id() -> str:
    """A fresh random 128-bit id (32 hex chars), used for sessions and turns."""
    return secrets.token_hex(16)


def derived_session_id(tenant: str, idempotency_key: str) -> str:
    """Session id for an idempotent create: the same (tenant, key) always names the same session.

    This keeps the create's idempotency record inside the session's own slot (cluster-safe and
    atomic). It is as unguessable as the key, and tenant checks still apply on every access.
    """
    digest = hashlib.sha256(f"{tenant}\x00{idempotency_key}".encode()).hexdigest()
    return digest[:32]


def check_tenant(tenant: str) -> None:
    """Raise ValueError for an empty tenant (tenants come from authentication, not clients)."""
    if not tenant:
        raise ValueError("tenant must be a non-empty string")


def check_idempotency_key(key: str) -> None:
    """Raise InvalidTreeOperation unless the key has 1-255 chars (Stripe's limit)."""
    if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY_LEN:
        raise InvalidTreeOperation(f"idempotency key must have 1-{MAX_IDEMPOTENCY_KEY_LEN} chars")


def is_valid_id(value: str) -> bool:
    """True if `value` can be a session or turn id (safe inside a key name)."""
    return _ID_RE.fullmatch(value) is not None


def is_valid_branch(name: str) -> bool:
    """True if `name` can be a branch name: 1-128 of [A-Za-z0-9._-], not starting with . or -."""
    return _BRANCH_RE.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """Key names of one session. `prefix` must not contain '{' or '}' (it would steal the tag)."""

    prefix: str
    session_id: str

    @property
    def base(self) -> str:
        """Common beginning of every key of the session; Lua scripts derive tree keys from it."""
        return f"{self.prefix}{{{self.session_id}}}:"

    @property
    def meta(self) -> str:
        return self.base + "meta"

    @property
    def branches(self) -> str:
        return self.base + "br"

    @property
    def turns(self) -> str:
        return self.base + "turns"

    @property
    def events(self) -> str:
        return self.base + "ev"

    @property
    def idem_index(self) -> str:
        return self.base + "idem"

    @property
    def paths(self) -> str:
        return self.base + "paths"

    def turn(self, turn_id: str) -> str:
        return f"{self.base}t:{turn_id}"

    def children(self, turn_id: str) -> str:
        return f"{self.base}ch:{turn_id}"

    def idem(self, idempotency_key: str) -> str:
        # Hashed: keys are client-chosen strings of up to 255 chars of any kind.
        return f"{self.base}idem:{hashlib.sha256(idempotency_key.encode()).hexdigest()}"

    @property
    def fixed(self) -> list[str]:
        """The keys every mutation script takes as KEYS[1..5]."""
        return [self.meta, self.branches, self.turns, self.events, self.idem_index]


def tenant_base(prefix: str, tenant: str) -> str:
    """Common beginning of a tenant's tenant-wide keys: `<prefix>{tenant:<tenant>}:`, one
    cluster slot per tenant (not any session's)."""
    return f"{prefix}{{tenant:{tenant}}}:"


def tenant_index_key(prefix: str, tenant: str) -> str:
    """ZSET of a tenant's session ids."""
    return tenant_base(prefix, tenant) + "sessions"


def tenant_paths_key(prefix: str, tenant: str) -> str:
    """HASH of a tenant's path hashes -> session id."""
    return tenant_base(prefix, tenant) + "paths"
