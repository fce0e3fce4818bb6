"""Reads for browsing a tenant's sessions (the `/ui` page): listing with search, and the tree
in pages with each turn's payload.

These are snapshots in a few round trips, not atomic: a session deleted while it is listed is
left out, and a tree page read while turns land may miss the newest ones (the next page or the
event stream brings them). Tenancy is the reader's: another tenant's session is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sessions.codec import decode_branches, decode_session, decode_turn
from sessions.errors import SessionNotFound
from sessions.keys import tenant_index_key
from sessions.models import Session, Turn
from sessions.reader import SessionReader

# The turn hash fields a tree row needs: all but the packed token ids.
_ROW_FIELDS = ("parent", "role", "depth", "seq", "version", "created_ms", "messages",
               "tool_calls", "usage", "finish_reason", "worker", "num_tokens")
SCAN_CHUNK = 200  # index entries read per round trip while listing


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One session of a listing: its metadata, branches and number of turns (root included)."""

    session: Session
    num_turns: int


@dataclass(frozen=True, slots=True)
class SessionPage:
    rows: list[SessionRow]
    next_cursor: int | None  # index offset to continue from; None: the listing is complete


@dataclass(frozen=True, slots=True)
class TreeRow:
    """A turn without its token ids, and the number of them."""

    turn: Turn
    num_tokens: int


@dataclass(frozen=True, slots=True)
class TreePage:
    session: Session
    num_turns: int  # in the whole tree, root included
    offset: int
    rows: list[TreeRow] = field(default_factory=list)

    @property
    def next_offset(self) -> int | None:
        end = self.offset + len(self.rows)
        return end if end < self.num_turns else None


def matches(session: Session, query: str) -> bool:
    """True when `query` (case-insensitive) is in the session id or its metadata's JSON."""
    needle = query.casefold()
    if needle in session.id.casefold():
        return True
    return needle in json.dumps(session.metadata, ensure_ascii=False).casefold()


async def list_session_rows(reader: SessionReader, tenant: str, *, query: str = "",
                            limit: int = 50, cursor: int = 0,
                            max_scanned: int = 5000) -> SessionPage:
    """Up to `limit` of the tenant's sessions, newest first, from index offset `cursor`,
    those matching `query` only (see `matches`). Reads at most `max_scanned` index entries;
    `next_cursor` says where to go on when the page is full or the scan stopped early."""
    key = tenant_index_key(reader.key_prefix, tenant)
    rows: list[SessionRow] = []
    offset = cursor
    while len(rows) < limit and offset - cursor < max_scanned:
        raw_ids: Any = await reader.redis.zrange(key, offset, offset + SCAN_CHUNK - 1, desc=True)
        if not raw_ids:
            return SessionPage(rows, None)
        ids = [i.decode() for i in raw_ids]
        for n, row in enumerate(await _rows(reader, ids, tenant)):
            if row is not None and (not query or matches(row.session, query)):
                rows.append(row)
                if len(rows) == limit:
                    return SessionPage(rows, offset + n + 1)
        offset += len(ids)
    more: Any = await reader.redis.zcard(key)
    return SessionPage(rows, offset if offset < int(more) else None)


async def _rows(reader: SessionReader, ids: list[str], tenant: str) -> list[SessionRow | None]:
    async with reader.redis.pipeline(transaction=False) as pipe:
        for session_id in ids:
            keys = reader.keys(session_id)
            pipe.hgetall(keys.meta)
            pipe.hgetall(keys.branches)
            pipe.zcard(keys.turns)
        replies = await pipe.execute()
    out: list[SessionRow | None] = []
    for n, session_id in enumerate(ids):
        meta, branches, num_turns = replies[3 * n: 3 * n + 3]
        if meta.get(b"tenant") != tenant.encode():
            out.append(None)  # deleted since it was indexed
            continue
        session = decode_session(session_id, meta, int(meta[b"version"]),
                                 decode_branches(branches))
        out.append(SessionRow(session, int(num_turns)))
    return out


async def tree_page(reader: SessionReader, session_id: str, *, tenant: str, offset: int = 0,
                    limit: int = 1000) -> TreePage:
    """Turns `offset` .. `offset + limit - 1` of the tree in creation (seq) order, with their
    payloads but not their token ids. Raises SessionNotFound."""
    keys = reader.keys(session_id)
    async with reader.redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.meta)
        pipe.hgetall(keys.branches)
        pipe.zcard(keys.turns)
        pipe.zrange(keys.turns, offset, offset + limit - 1)
        meta, branches, num_turns, raw_ids = await pipe.execute()
    if meta.get(b"tenant") != tenant.encode():
        raise SessionNotFound(session_id)
    session = decode_session(session_id, meta, int(meta[b"version"]), decode_branches(branches))
    turn_ids = [i.decode() for i in raw_ids]
    async with reader.redis.pipeline(transaction=False) as pipe:
        for turn_id in turn_ids:
            pipe.hmget(keys.turn(turn_id), _ROW_FIELDS)
        values = await pipe.execute()
    rows = []
    for turn_id, fields in zip(turn_ids, values, strict=True):
        if fields[1] is None:
            continue  # gone since the index was read (the session is being deleted)
        raw = {name.encode(): value for name, value in zip(_ROW_FIELDS, fields, strict=True)
               if value is not None}
        rows.append(TreeRow(decode_turn(session_id, turn_id, raw), int(fields[-1] or 0)))
    return TreePage(session, int(num_turns), offset, rows)
