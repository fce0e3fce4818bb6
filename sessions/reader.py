"""SessionReader: the read side of the session store (`SessionStore` extends it with mutations).

Every read is one round trip: a MULTI pipeline for snapshots, or a read-only Lua script for walks
over the tree. Tenancy: a session of another tenant behaves exactly like a missing one.
"""

from __future__ import annotations

from typing import Any

from redis.commands.core import AsyncScript

from sessions import lua
from sessions.codec import (
    decode_branches,
    decode_event,
    decode_session,
    decode_summary,
    decode_turn,
    raise_for_reply,
    xread_entries,
)
from sessions.errors import SessionNotFound, TurnNotFound
from sessions.invariants import check_session_invariants
from sessions.keys import SessionKeys, is_valid_id, tenant_index_key
from sessions.models import Session, SessionEvent, Turn, TurnSummary, unpack_token_ids
from sessions.redis_client import StoreClient, decodes_responses


class SessionReader:
    """Reads of session trees. `redis` must use `decode_responses=False` (token ids are binary).

    Holds no state besides the client and script handles; one instance per process is enough.
    """

    def __init__(self, redis: StoreClient, *, key_prefix: str = "rg:") -> None:
        if "{" in key_prefix or "}" in key_prefix:
            raise ValueError(
                "key_prefix must not contain '{' or '}' (it would replace the hash tag)"
            )
        if decodes_responses(redis):
            raise ValueError("the session store needs a Redis client with decode_responses=False")
        self.redis = redis
        self.key_prefix = key_prefix
        self._path: AsyncScript = redis.register_script(lua.PATH)
        self._tree: AsyncScript = redis.register_script(lua.TREE)

    def keys(self, session_id: str) -> SessionKeys:
        """Key names of a session. Raises SessionNotFound for an id that cannot exist."""
        if not is_valid_id(session_id):
            raise SessionNotFound(session_id)
        return SessionKeys(self.key_prefix, session_id)

    async def get_session(self, session_id: str, *, tenant: str) -> Session:
        """Session meta and branches as one atomic snapshot. Raises SessionNotFound."""
        keys = self.keys(session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            pipe.hgetall(keys.branches)
            meta, branches = await pipe.execute()
        if meta.get(b"tenant") != tenant.encode():
            raise SessionNotFound(session_id)
        return decode_session(session_id, meta, int(meta[b"version"]), decode_branches(branches))

    async def get_turn(self, session_id: str, turn_id: str, *, tenant: str) -> Turn:
        """One turn with its payload and token ids. Raises SessionNotFound, TurnNotFound."""
        keys = self.keys(session_id)
        if not is_valid_id(turn_id):
            raise TurnNotFound(session_id, turn_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.meta, "tenant")
            pipe.hgetall(keys.turn(turn_id))
            owner, raw = await pipe.execute()
        if owner != tenant.encode():
            raise SessionNotFound(session_id)
        if not raw:
            raise TurnNotFound(session_id, turn_id)
        return decode_turn(session_id, turn_id, raw)

    async def get_tree(self, session_id: str, *, tenant: str) -> list[TurnSummary]:
        """Every turn of the session (no payloads), in creation order. Raises SessionNotFound."""
        keys = self.keys(session_id)
        reply = await self._tree(keys=[keys.meta, keys.turns], args=[keys.base, tenant])
        if reply[0] != b"OK":
            raise_for_reply(reply, session_id)
        return [decode_summary(reply[i : i + 6]) for i in range(1, len(reply), 6)]

    async def children(self, session_id: str, turn_id: str, *, tenant: str) -> list[str]:
        """Ids of the turns whose parent is `turn_id`, oldest first. Raises *NotFound."""
        keys = self.keys(session_id)
        if not is_valid_id(turn_id):
            raise TurnNotFound(session_id, turn_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(keys.meta, "tenant")
            pipe.exists(keys.turn(turn_id))
            pipe.zrange(keys.children(turn_id), 0, -1)
            owner, exists, child_ids = await pipe.execute()
        if owner != tenant.encode():
            raise SessionNotFound(session_id)
        if not exists:
            raise TurnNotFound(session_id, turn_id)
        return [c.decode() for c in child_ids]

    async def token_path(self, session_id: str, turn_id: str, *, tenant: str) -> list[int]:
        """All token ids from the root to `turn_id` inclusive (the full prompt the turn ends).

        One round trip: a script walks the parents and concatenates the packed deltas.
        Raises SessionNotFound, TurnNotFound."""
        blob, _ = await self._walk(session_id, turn_id, tenant, with_tokens=True)
        return list(unpack_token_ids(blob))

    async def path_turn_ids(self, session_id: str, turn_id: str, *, tenant: str) -> list[str]:
        """Turn ids from the root to `turn_id` inclusive. Raises SessionNotFound, TurnNotFound."""
        _, ids = await self._walk(session_id, turn_id, tenant, with_tokens=False)
        return ids

    async def list_sessions(self, tenant: str, *, limit: int = 100) -> list[str]:
        """The tenant's session ids, newest first (eventually consistent with creates/deletes)."""
        key = tenant_index_key(self.key_prefix, tenant)
        ids: Any = await self.redis.zrange(key, 0, limit - 1, desc=True)
        return [i.decode() for i in ids]

    async def read_events(
        self,
        session_id: str,
        *,
        tenant: str,
        after: str = "0-0",
        count: int = 100,
        block_ms: int | None = None,
    ) -> list[SessionEvent]:
        """Events after stream id `after` (exclusive), oldest first; `after` is an SSE
        Last-Event-ID. With `block_ms`, waits up to that long for one. Raises SessionNotFound."""
        keys = self.keys(session_id)
        if await self.redis.hget(keys.meta, "tenant") != tenant.encode():
            raise SessionNotFound(session_id)
        entries: Any  # [(id, {field: value})], bytes throughout
        if block_ms is None:
            entries = await self.redis.xrange(keys.events, min=f"({after}", count=count)
        else:
            reply = await self.redis.xread({keys.events: after}, count=count, block=block_ms)
            entries = xread_entries(reply)
        return [decode_event(entry_id, fields) for entry_id, fields in entries]

    async def check_invariants(self, session_id: str) -> None:
        """Raise AssertionError if the stored tree of `session_id` breaks an invariant."""
        await check_session_invariants(self, session_id)

    async def _walk(
        self, session_id: str, turn_id: str, tenant: str, *, with_tokens: bool
    ) -> tuple[bytes, list[str]]:
        keys = self.keys(session_id)
        if not is_valid_id(turn_id):
            raise TurnNotFound(session_id, turn_id)
        args = [keys.base, tenant, turn_id, "1" if with_tokens else "0"]
        reply = await self._path(keys=[keys.meta], args=args)
        if reply[0] != b"OK":
            raise_for_reply(reply, session_id)
        return reply[1], [i.decode() for i in reply[2:]]
