"""Invariants of one stored session tree, checked against the raw Redis keys.

Tests call `check_session_invariants` after every operation; it reads the whole session, so it is
for tests and debugging, not for request paths. It raises AssertionError naming the broken rule.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from sessions.codec import decode_turn
from sessions.errors import StoreCorruption
from sessions.models import Turn

if TYPE_CHECKING:
    from sessions.reader import SessionReader


async def check_session_invariants(store: SessionReader, session_id: str) -> None:
    """Raise AssertionError unless the stored session satisfies every invariant:

    - meta exists; `num_turns` equals the turn index size; seqs are exactly 0..n-1;
    - the root (meta `root`) is the only turn without a parent, at depth 0, seq 0, version 1;
    - every other turn's parent is in the session, was created earlier (smaller seq: so there is
      no cycle), and is one level shallower; turn versions never exceed the session version;
    - each turn's children ZSET is exactly the set of turns naming it as parent (scored by seq);
    - `num_tokens` matches the packed token ids;
    - the default branch exists and every branch head is a turn of the session;
    - version >= 1 + (distinct versions that created turns) + (branches besides the default),
      i.e. at least one mutation per append call and per fork;
    - the newest event carries the current version and event versions increase along the stream;
    - every idempotency index entry names a key of this session;
    - every turn lease is on an existing branch and reads "<lease id>|<expiry ms>".
    """
    keys = store.keys(session_id)
    async with store.redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.meta)
        pipe.hgetall(keys.branches)
        pipe.zrange(keys.turns, 0, -1, withscores=True)
        pipe.xrevrange(keys.events, count=20)
        pipe.zrange(keys.idem_index, 0, -1)
        pipe.hgetall(keys.base + "leases")
        meta, raw_branches, index, events, idem, leases = await pipe.execute()
    where = f"session {session_id}"
    assert meta, f"{where}: meta hash missing"
    version, num_turns = int(meta[b"version"]), int(meta[b"num_turns"])
    root_id, default_branch = meta[b"root"].decode(), meta[b"default_branch"].decode()
    seqs = {member.decode(): int(score) for member, score in index}
    assert len(seqs) == num_turns, f"{where}: index has {len(seqs)} turns, meta {num_turns}"
    assert sorted(seqs.values()) == list(range(num_turns)), f"{where}: seqs are not 0..n-1"

    async with store.redis.pipeline(transaction=True) as pipe:
        for turn_id in seqs:
            pipe.hgetall(keys.turn(turn_id))
            pipe.zrange(keys.children(turn_id), 0, -1, withscores=True)
        replies = await pipe.execute()
    turns: dict[str, Turn] = {}
    children: dict[str, dict[str, int]] = {}
    for i, turn_id in enumerate(seqs):
        raw = replies[2 * i]
        assert raw, f"{where}: turn {turn_id} is indexed but has no hash"
        try:
            turns[turn_id] = decode_turn(session_id, turn_id, raw)
        except StoreCorruption as exc:
            raise AssertionError(str(exc)) from exc
        assert int(raw[b"num_tokens"]) == turns[turn_id].num_tokens, f"{turn_id}: num_tokens"
        children[turn_id] = {m.decode(): int(s) for m, s in replies[2 * i + 1]}

    expected_children: dict[str, dict[str, int]] = defaultdict(dict)
    for turn in turns.values():
        assert turn.seq == seqs[turn.id], f"{where}: turn {turn.id} seq differs from its index"
        assert turn.version <= version, f"{where}: turn {turn.id} newer than session version"
        if turn.id == root_id:
            assert turn.parent_id is None and turn.role == "root", f"{where}: bad root {turn}"
            assert (turn.depth, turn.seq, turn.version) == (0, 0, 1), f"{where}: bad root {turn}"
            continue
        assert turn.role != "root", f"{where}: second root {turn.id}"
        assert turn.parent_id in turns, f"{where}: parent of {turn.id} missing"
        parent = turns[turn.parent_id]
        assert parent.seq < turn.seq, f"{where}: {turn.id} created before its parent (cycle?)"
        assert turn.depth == parent.depth + 1, f"{where}: depth of {turn.id}"
        assert turn.version >= parent.version, f"{where}: version of {turn.id}"
        expected_children[parent.id][turn.id] = turn.seq
    for turn_id, kids in children.items():
        assert kids == expected_children.get(turn_id, {}), f"{where}: children of {turn_id}"

    branches = {k.decode(): v.decode() for k, v in raw_branches.items()}
    assert default_branch in branches, f"{where}: default branch {default_branch!r} missing"
    for name, head in branches.items():
        assert head in turns, f"{where}: head {head!r} of branch {name!r} is not a turn"
    append_versions = {t.version for t in turns.values() if t.id != root_id}
    min_version = 1 + len(append_versions) + len(branches) - 1
    assert version >= min_version, f"{where}: version {version} < {min_version} mutations"

    event_versions = [int(fields[b"version"]) for _, fields in events]
    if event_versions:
        assert event_versions[0] == version, f"{where}: newest event is not version {version}"
        assert event_versions == sorted(event_versions, reverse=True), f"{where}: event order"
        assert len(set(event_versions)) == len(event_versions), f"{where}: duplicate event"
    for member in idem:
        assert member.decode().startswith(keys.base + "idem:"), f"{where}: idem entry {member!r}"
    for name, lease in leases.items():
        assert name.decode() in branches, f"{where}: lease on a missing branch {name!r}"
        lease_id, _, expiry = lease.decode().partition("|")
        assert lease_id and expiry.isdigit(), f"{where}: malformed lease {lease!r}"
