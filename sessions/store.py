"""SessionStore: the trajectory tree of turns in Redis / Valkey (schema: `sessions.keys`).

Every mutation is one Lua script (`sessions.lua`): tenant check → idempotency record → expected
version → the operation's checks → writes → version bump and one event on the session's stream.

Tenancy: every call names the caller's `tenant`; a session of another tenant behaves exactly like
a missing one (SessionNotFound). Idempotency: a mutation given `idempotency_key` records its
request hash and result for `idempotency_ttl_s`; a retry with the same arguments returns the first
result without writing, the same key with different arguments raises IdempotencyConflict. Only
successes are recorded, so a retry of a failed request runs again. A replay is not distinguishable
from a first success by its return value (both are the first result).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from redis.commands.core import AsyncScript

from sessions import lua
from sessions.codec import (
    EncodedTurn,
    decode_appended,
    decode_branches,
    decode_session,
    dumps,
    pairs,
    raise_for_reply,
    request_hash,
    text,
)
from sessions.durability import NO_WAIT, Durability, run_durably
from sessions.errors import BranchNotFound, InvalidTreeOperation, TurnNotFound
from sessions.keys import (
    SessionKeys,
    check_idempotency_key,
    check_tenant,
    derived_session_id,
    is_valid_branch,
    is_valid_id,
    new_id,
    tenant_index_key,
)
from sessions.models import DEFAULT_BRANCH, NewTurn, Session, Turn, pack_token_ids
from sessions.path_index import PathIndex
from sessions.reader import SessionReader
from sessions.redis_client import StoreClient
from sessions.turn_commit import TurnCommits


class SessionStore(SessionReader):
    """Async store of session trees: the reads of `SessionReader` plus every mutation.

    `redis` (one server or a cluster) must use `decode_responses=False`. Idempotency records
    live `idempotency_ttl_s`; the event stream is capped near `stream_maxlen` entries. With
    `durability` a mutation (create, append, fork, rewind, delete) is acknowledged only once
    that many replicas hold it (`sessions.durability`; else it raises NotReplicated).
    """

    def __init__(
        self,
        redis: StoreClient,
        *,
        key_prefix: str = "rg:",
        idempotency_ttl_s: int = 24 * 3600,
        stream_maxlen: int = 10_000,
        durability: Durability = NO_WAIT,
    ) -> None:
        super().__init__(redis, key_prefix=key_prefix)
        self._idem_ttl_s = idempotency_ttl_s
        self._maxlen = stream_maxlen
        self.durability = durability
        self._create: AsyncScript = redis.register_script(lua.CREATE)
        self._append_script: AsyncScript = redis.register_script(lua.APPEND)
        self._fork: AsyncScript = redis.register_script(lua.FORK)
        self._rewind: AsyncScript = redis.register_script(lua.REWIND)
        self._delete: AsyncScript = redis.register_script(lua.DELETE)
        self.paths = PathIndex(redis, key_prefix=key_prefix)  # deleted with each session
        self.turns = TurnCommits(self)

    @property
    def stream_maxlen(self) -> int:
        """Approximate cap on each session's event stream."""
        return self._maxlen

    # ---- mutations ------------------------------------------------------------------------

    async def create_session(
        self,
        tenant: str,
        model: str,
        *,
        system_token_ids: Sequence[int] = (),
        system: str | list[dict[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        root_path_hash: str | None = None,
    ) -> Session:
        """Create a session whose root turn holds `system_token_ids`; branch "main" points at it.
        One round trip; with `root_path_hash` the root is also indexed under it (path index).

        Version 1. With `idempotency_key` the session id is derived from (tenant, key), so a retry
        returns the session as first created (no expiry while the session exists; after
        `delete_session` the key is free again); different arguments with the same key raise
        IdempotencyConflict. Raises ValueError (a token id is not a uint32, empty tenant),
        InvalidTreeOperation (metadata/system/tools not JSON-serializable, bad key length).
        """
        check_tenant(tenant)
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)
        sid = new_id() if idempotency_key is None else derived_session_id(tenant, idempotency_key)
        keys, root_id = SessionKeys(self.key_prefix, sid), new_id()
        blob = pack_token_ids(system_token_ids)
        fields = [dumps(dict(metadata or {})), dumps(system), dumps([dict(t) for t in tools])]
        create_hash = ""
        if idempotency_key is not None:
            create_hash = request_hash(
                "create",
                {"model": model, "fields": fields, "tokens": hashlib.sha256(blob).hexdigest()},
            )
        keys_ = [keys.meta, keys.branches, keys.turns, keys.events, keys.turn(root_id),
                 keys.paths]
        args: list[str | bytes] = [tenant, create_hash, model, *fields, root_id, blob]
        args += [DEFAULT_BRANCH, str(self._maxlen), root_path_hash or ""]
        # The tenant's index is in another slot; sent in the same round trip (NX keeps a
        # replay's first score). It is only a listing: an entry whose create failed names a
        # session that reads as missing.
        listing = ("ZADD", tenant_index_key(self.key_prefix, tenant), "NX", time.time() * 1000,
                   sid)
        reply, _ = await run_durably(self.redis, self._create, keys_, args, self.durability,
                                     extra=[listing])
        if reply[0] not in (b"OK", b"DUP"):
            raise_for_reply(reply, sid)
        meta = pairs(reply[1])
        root = text(meta.get(b"root"))
        return decode_session(sid, meta, 1, {text(meta.get(b"default_branch")): root})

    async def append_turns(
        self,
        session_id: str,
        *,
        tenant: str,
        turns: Sequence[NewTurn],
        branch: str | None = None,
        parent_turn_id: str | None = None,
        expected_version: int | None = None,
        expected_head: str | None = None,
        idempotency_key: str | None = None,
        move_branch: bool = True,
    ) -> list[Turn]:
        """Append `turns` as a chain (each the parent of the next) in one atomic write.

        `branch` (default "main") must exist. The chain hangs under `parent_turn_id`, default the
        branch head. With `move_branch` the branch head then moves to the last new turn, which is
        allowed only as a fast-forward: the current head must be `parent_turn_id` or an ancestor
        of it (e.g. an input turn appended earlier with move_branch=False). Appending under any
        other turn while moving the branch raises HeadMoved: fork a branch there first. With
        `move_branch=False` the chain may hang under any turn and no branch moves.
        Raises SessionNotFound, BranchNotFound, TurnNotFound (parent), VersionConflict
        (`expected_version`), HeadMoved (`expected_head` differs from the head, or not a
        fast-forward), IdempotencyConflict, InvalidTreeOperation (no turns).
        """
        appended, _ = await self._append(
            session_id, tenant, [(new_id(), t) for t in turns], branch or DEFAULT_BRANCH,
            parent_turn_id, expected_version=expected_version, expected_head=expected_head,
            idempotency_key=idempotency_key, move_branch=move_branch)
        return appended

    async def _append(
        self, session_id: str, tenant: str, turns: Sequence[tuple[str, NewTurn]], branch: str,
        parent_turn_id: str | None, *, expected_version: int | None, expected_head: str | None,
        idempotency_key: str | None, move_branch: bool, lease_id: str | None = None,
        fork_branch: str | None = None, idempotency_fields: Mapping[str, Any] | None = None,
    ) -> tuple[list[Turn], str]:  # fmt: skip
        """`append_turns` with the turns' ids given; also releases `lease_id` on `branch` and,
        when the head moved, forks `fork_branch` at the parent and appends there. With
        `idempotency_fields` the request hash is of those (not of the turns). Returns the
        turns and the branch that holds them."""
        keys = self.keys(session_id)
        if not turns:
            raise InvalidTreeOperation("append_turns needs at least one turn")
        if not is_valid_branch(branch) or (fork_branch and not is_valid_branch(fork_branch)):
            raise BranchNotFound(session_id, branch)
        if parent_turn_id is not None and not is_valid_id(parent_turn_id):
            raise TurnNotFound(session_id, parent_turn_id)
        if any(not is_valid_id(turn_id) for turn_id, _ in turns):
            raise InvalidTreeOperation("turn ids must be 1-128 of [A-Za-z0-9_-]")
        encoded = [EncodedTurn.of(turn_id, t) for turn_id, t in turns]
        fields = idempotency_fields or {
            "branch": branch,
            "parent": parent_turn_id,
            "expected_head": expected_head,
            "move_branch": move_branch,
            "turns": [e.fingerprint() for e in encoded],
        }
        args: list[str | bytes | int] = [branch, parent_turn_id or "", expected_head or ""]
        args += ["1" if move_branch else "0", len(turns), lease_id or "", fork_branch or ""]
        args += [value for e in encoded for value in e.args()]
        result, _ = await self._mutate(
            self._append_script, keys, tenant, "append", fields, idempotency_key,
            expected_version, [keys.turn(e.id) for e in encoded], args, branch,
        )  # fmt: skip
        return decode_appended(session_id, encoded, result, branch)

    async def fork(
        self,
        session_id: str,
        from_turn_id: str,
        new_branch: str,
        *,
        tenant: str,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Session:
        """Create branch `new_branch` with head `from_turn_id` (any turn of the session).

        Raises SessionNotFound, TurnNotFound, BranchExists, VersionConflict, IdempotencyConflict,
        InvalidTreeOperation (bad branch name).
        """
        keys = self.keys(session_id)
        if not is_valid_branch(new_branch):
            raise InvalidTreeOperation(f"invalid branch name {new_branch!r}")
        if not is_valid_id(from_turn_id):
            raise TurnNotFound(session_id, from_turn_id)
        fields = {"branch": new_branch, "turn": from_turn_id}
        return await self._branch_op(
            self._fork, keys, tenant, "fork", fields, idempotency_key, expected_version,
            [new_branch, from_turn_id], new_branch,
        )  # fmt: skip

    async def rewind(
        self,
        session_id: str,
        branch: str,
        to_turn_id: str,
        *,
        tenant: str,
        expected_version: int | None = None,
        expected_head: str | None = None,
        idempotency_key: str | None = None,
    ) -> Session:
        """Move `branch`'s head back to `to_turn_id`, which must be an ancestor-or-self of the head.

        The abandoned turns stay in the tree (turns are immutable). The `branch.moved` event names
        the old head, so the gateway can drop engine pins of the abandoned path.
        Raises SessionNotFound, BranchNotFound, TurnNotFound, HeadMoved (`expected_head`),
        VersionConflict, IdempotencyConflict, InvalidTreeOperation (not an ancestor).
        """
        keys = self.keys(session_id)
        if not is_valid_branch(branch):
            raise BranchNotFound(session_id, branch)
        if not is_valid_id(to_turn_id):
            raise TurnNotFound(session_id, to_turn_id)
        fields = {"branch": branch, "turn": to_turn_id, "expected_head": expected_head}
        return await self._branch_op(
            self._rewind, keys, tenant, "rewind", fields, idempotency_key, expected_version,
            [branch, to_turn_id, expected_head or ""], branch,
        )  # fmt: skip

    async def delete_session(self, session_id: str, *, tenant: str) -> None:
        """Remove every key of the session (turns, branches, events, idempotency records).

        Raises SessionNotFound (so a retried delete answers 404)."""
        keys = self.keys(session_id)
        check_tenant(tenant)
        path_hashes = await self.paths.session_hashes(session_id)
        reply, _ = await run_durably(self.redis, self._delete, keys.fixed, [keys.base, tenant],
                                     self.durability)
        if reply[0] != b"OK":
            raise_for_reply(reply, session_id)
        await self.redis.zrem(tenant_index_key(self.key_prefix, tenant), session_id)
        await self.paths.forget(tenant, session_id, path_hashes)

    # ---- internals ------------------------------------------------------------------------

    async def _mutate(
        self, script: AsyncScript, keys: SessionKeys, tenant: str, op: str,
        fields: Mapping[str, Any], idempotency_key: str | None, expected_version: int | None,
        extra_keys: list[str], extra_args: Sequence[str | bytes | int], branch: str | None,
    ) -> tuple[bytes, dict[bytes, bytes]]:  # fmt: skip
        """Run a mutation script; return (result JSON, meta hash or {}) or raise its error."""
        check_tenant(tenant)
        req_hash, idem_key = "", keys.base + "idem:"  # placeholder key, never written
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)
            req_hash = request_hash(op, {**fields, "expected_version": expected_version})
            idem_key = keys.idem(idempotency_key)
        version_arg = "" if expected_version is None else str(expected_version)
        reply, _ = await run_durably(
            self.redis, script, [*keys.fixed, idem_key, *extra_keys],
            [keys.base, tenant, req_hash, self._idem_ttl_s, version_arg, self._maxlen,
             *extra_args], self.durability)
        if reply[0] not in (b"OK", b"DUP"):
            raise_for_reply(reply, keys.session_id, branch, expected_version)
        return reply[1], pairs(reply[2])

    async def _branch_op(
        self, script: AsyncScript, keys: SessionKeys, tenant: str, op: str,
        fields: Mapping[str, Any], idempotency_key: str | None, expected_version: int | None,
        args: list[str], branch: str,
    ) -> Session:  # fmt: skip
        result, meta = await self._mutate(
            script, keys, tenant, op, fields, idempotency_key, expected_version, [], args, branch
        )
        data = json.loads(result)
        flat = [b.encode() for b in data["br"]]
        return decode_session(keys.session_id, meta, int(data["v"]), decode_branches(pairs(flat)))
