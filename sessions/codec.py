"""Encoding between the session models and Redis hash fields / Lua script replies.

Redis replies arrive as bytes (the store requires `decode_responses=False`, because token ids are
binary). JSON fields are stored compact, in the caller's key order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn, cast

from sessions.errors import (
    BranchBusy,
    BranchExists,
    BranchNotFound,
    HeadMoved,
    IdempotencyConflict,
    InvalidTreeOperation,
    SessionNotFound,
    StoreCorruption,
    TurnNotFound,
    VersionConflict,
)
from sessions.models import (
    ROLES,
    NewTurn,
    Role,
    Session,
    SessionEvent,
    Turn,
    TurnSummary,
    pack_token_ids,
    unpack_token_ids,
)

RawHash = Mapping[bytes, bytes]


def dumps(value: object) -> str:
    """Compact JSON of `value`. Raises InvalidTreeOperation if it is not JSON-serializable."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidTreeOperation(f"value is not JSON-serializable: {exc}") from exc


def request_hash(op: str, fields: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys) of an operation and its arguments.

    Two calls with one idempotency key are "the same request" iff their hashes are equal.
    """
    try:
        canonical = json.dumps(
            {"op": op, **fields}, sort_keys=True, separators=(",", ":"), allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise InvalidTreeOperation(f"request is not JSON-serializable: {exc}") from exc
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class EncodedTurn:
    """A NewTurn with its id, encoded as the stored hash fields (JSON strings, packed ids)."""

    id: str
    role: Role
    messages: str
    tool_calls: str
    token_ids: bytes
    usage: str
    finish_reason: str
    worker: str = ""

    @classmethod
    def of(cls, turn_id: str, turn: NewTurn) -> EncodedTurn:
        """Encode `turn`. Raises InvalidTreeOperation (not JSON-able), ValueError (token id)."""
        return cls(
            id=turn_id,
            role=turn.role,
            messages=dumps([dict(m) for m in turn.messages]),
            tool_calls=dumps([dict(c) for c in turn.tool_calls]),
            token_ids=pack_token_ids(turn.token_ids),
            usage=dumps(None if turn.usage is None else dict(turn.usage)),
            finish_reason=turn.finish_reason or "",
            worker=turn.worker or "",
        )

    def args(self) -> list[str | bytes]:
        """The 8 ARGV values of this turn for the append script, in the script's order."""
        return [
            self.id,
            self.role,
            self.messages,
            self.tool_calls,
            self.token_ids,
            self.usage,
            self.finish_reason,
            self.worker,
        ]

    def fingerprint(self) -> list[str]:
        """What of the turn enters the request hash: everything but the generated id and the
        worker (a retry may run on another one)."""
        tokens = hashlib.sha256(self.token_ids).hexdigest()
        return [self.role, self.messages, self.tool_calls, tokens, self.usage, self.finish_reason]

    def to_turn(
        self,
        session_id: str,
        *,
        parent_id: str,
        depth: int,
        seq: int,
        version: int,
        created_ms: int,
    ) -> Turn:
        """The Turn as the store holds it once written (equal to what `get_turn` returns)."""
        return Turn(
            id=self.id,
            session_id=session_id,
            parent_id=parent_id,
            role=self.role,
            depth=depth,
            seq=seq,
            version=version,
            created_ms=created_ms,
            token_ids=unpack_token_ids(self.token_ids),
            messages=tuple(json.loads(self.messages)),
            tool_calls=tuple(json.loads(self.tool_calls)),
            usage=json.loads(self.usage),
            finish_reason=self.finish_reason or None,
            worker=self.worker or None,
        )


def text(raw: bytes | None) -> str:
    """Decode a UTF-8 Redis reply; a missing field is ''."""
    return "" if raw is None else raw.decode()


def pairs(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """HGETALL as returned by a Lua script (a flat [k1, v1, k2, v2, ...] list) → dict."""
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def _role(raw: bytes | None, where: str) -> Role:
    role = text(raw)
    if role not in ROLES:
        raise StoreCorruption(f"{where}: unknown role {role!r}")
    return cast(Role, role)


def decode_turn(session_id: str, turn_id: str, raw: RawHash) -> Turn:
    """Build a Turn from its hash fields. Raises StoreCorruption if a field is missing or bad."""
    try:
        parent = text(raw[b"parent"])
        finish_reason = text(raw.get(b"finish_reason"))
        return Turn(
            id=turn_id,
            session_id=session_id,
            parent_id=parent or None,
            role=_role(raw[b"role"], f"turn {turn_id}"),
            depth=int(raw[b"depth"]),
            seq=int(raw[b"seq"]),
            version=int(raw[b"version"]),
            created_ms=int(raw[b"created_ms"]),
            token_ids=unpack_token_ids(raw.get(b"token_ids", b"")),
            messages=tuple(json.loads(raw[b"messages"])),
            tool_calls=tuple(json.loads(raw[b"tool_calls"])),
            usage=json.loads(raw[b"usage"]),
            finish_reason=finish_reason or None,
            worker=text(raw.get(b"worker")) or None,
        )
    except (KeyError, ValueError) as exc:
        raise StoreCorruption(f"turn {turn_id} of session {session_id}: {exc!r}") from exc


def decode_summary(row: Sequence[bytes | None]) -> TurnSummary:
    """One row of the tree script: id, seq, parent, role, depth, num_tokens."""
    turn_id, seq, parent, role, depth, num_tokens = row
    if turn_id is None or seq is None or depth is None or num_tokens is None:
        raise StoreCorruption(f"turn {text(turn_id)!r} has missing fields")
    return TurnSummary(
        id=turn_id.decode(),
        parent_id=text(parent) or None,
        role=_role(role, f"turn {turn_id.decode()}"),
        depth=int(depth),
        seq=int(float(seq)),  # ZRANGE WITHSCORES gives the score as a decimal string
        num_tokens=int(num_tokens),
    )


def decode_session(
    session_id: str, meta: RawHash, version: int, branches: Mapping[str, str]
) -> Session:
    """Build a Session from its meta hash plus the version and branches to report.

    The version and branches are passed separately so an idempotent replay can report the first
    result's values rather than the current ones. Raises StoreCorruption on a malformed meta.
    """
    try:
        tools = json.loads(meta[b"tools"])
        return Session(
            id=session_id,
            tenant=text(meta[b"tenant"]),
            model=text(meta[b"model"]),
            created_ms=int(meta[b"created_ms"]),
            version=version,
            root_turn_id=text(meta[b"root"]),
            default_branch=text(meta[b"default_branch"]),
            branches=dict(branches),
            metadata=json.loads(meta[b"metadata"]),
            system=json.loads(meta[b"system"]),
            tools=tuple(tools),
        )
    except (KeyError, ValueError) as exc:
        raise StoreCorruption(f"meta of session {session_id}: {exc!r}") from exc


def decode_branches(raw: Mapping[bytes, bytes]) -> dict[str, str]:
    """HGETALL of the branch hash → {name: head turn id}."""
    return {k.decode(): v.decode() for k, v in raw.items()}


def xread_entries(reply: Any) -> list[Any]:
    """The entries of a one-stream XREAD reply, whichever protocol the client speaks.

    RESP2: [[key, entries]] ([] on timeout); RESP3 (redis-py 8 default): {key: [entries]} ({}).
    """
    if not reply:
        return []
    if isinstance(reply, dict):
        (value,) = reply.values()
        return list(value[0]) if value and isinstance(value[0], list) else list(value)
    return list(reply[0][1])


def decode_event(entry_id: bytes, raw: Mapping[bytes, bytes]) -> SessionEvent:
    """One XRANGE / XREAD entry → SessionEvent (the `type` field moves out of `fields`)."""
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    return SessionEvent(id=entry_id.decode(), type=fields.pop("type", ""), fields=fields)


def raise_for_reply(
    reply: Sequence[Any], session_id: str, branch: str | None = None, expected: int | None = None
) -> NoReturn:
    """Turn a Lua script's non-OK status word into its typed error."""
    code, rest = reply[0].decode(), [r.decode() if isinstance(r, bytes) else r for r in reply[1:]]
    if code == "NOT_FOUND":
        raise SessionNotFound(session_id)
    if code == "IDEM_CONFLICT":
        raise IdempotencyConflict(session_id)
    if code == "VERSION":
        raise VersionConflict(session_id, expected or 0, int(rest[0]))
    if code == "NO_BRANCH":
        raise BranchNotFound(session_id, branch or "")
    if code == "HEAD_MOVED":
        raise HeadMoved(session_id, branch or "", rest[0], int(rest[1]), rest[2])
    if code == "NO_TURN":
        raise TurnNotFound(session_id, rest[0])
    if code == "BUSY":
        raise BranchBusy(session_id, rest[0] if rest else branch or "")
    if code == "BRANCH_EXISTS":
        raise BranchExists(session_id, branch or "")
    if code == "NOT_ANCESTOR":
        raise InvalidTreeOperation(f"rewind target is not an ancestor of the head of {branch!r}")
    raise StoreCorruption(f"session {session_id}: script answered {code} {rest}")


def decode_appended(session_id: str, encoded: Sequence[EncodedTurn], result: bytes,
                    branch: str) -> tuple[list[Turn], str]:
    """The turns an APPEND script stored (its JSON `result`) and the branch that holds them
    (`branch` unless the script forked). On a replay the ids are the first call's; the bodies
    are equal (same request hash)."""
    data = json.loads(result)
    ids: list[str] = data["ids"]
    version, created_ms = int(data["v"]), int(data["ms"])
    depth, seq = int(data["d"]), int(data["s"])
    parents = [data["p"], *ids[:-1]]
    appended = [
        replace(e, id=turn_id).to_turn(session_id, parent_id=parent, depth=depth + i,
                                       seq=seq + i, version=version, created_ms=created_ms)
        for i, (e, turn_id, parent) in enumerate(zip(encoded, ids, parents, strict=True))
    ]
    return appended, str(data.get("b", branch))
