"""The turn protocol on the real store: begin reserves the branch (BranchBusy for a second turn,
or a fork when asked), commit writes input and reply in one script and releases the lease,
nothing is written before the commit, and a lapsed lease falls back to a fork."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sessions import BranchNotFound, HeadMoved, SessionStore, VersionConflict
from sessions.errors import BranchBusy
from sessions.turn_commit import TurnStart
from tests.sessions.conftest import StoreBody
from tests.sessions.support import assistant, user

TTL_S = 30.0


async def _session(store: SessionStore) -> str:
    session = await store.create_session("acme", "m", system_token_ids=[1, 2])
    return session.id


async def _commit(store: SessionStore, start: TurnStart, n: int,
                  fork_branch: str | None = None) -> tuple[str, str | None]:
    (_, reply), branch = await store.turns.commit_turn(
        start, tenant="acme", turns=[(f"in{n:029d}", user(10 + n)),
                                     (f"out{n:028d}", assistant(20 + n))],
        fork_branch=fork_branch)
    await store.check_invariants(start.session.id)
    return reply.id, branch


def test_begin_reserves_and_commit_releases(with_store: Callable[[StoreBody], None]) -> None:
    async def body(store: SessionStore) -> None:
        sid = await _session(store)
        start = await store.turns.begin_turn(sid, tenant="acme", lease_id="a", lease_ttl_s=TTL_S)
        assert start.branch == "main" and not start.forked
        assert start.parent.role == "root" and start.parent.token_ids == (1, 2)
        assert start.session.version == 1  # a lease is not a tree change
        # Nothing is stored before the commit: the tree is still the root alone.
        assert len(await store.get_tree(sid, tenant="acme")) == 1
        with pytest.raises(BranchBusy):
            await store.turns.begin_turn(sid, tenant="acme", lease_id="b", lease_ttl_s=TTL_S)
        other = await store.turns.begin_turn(sid, tenant="acme", lease_id="b",
                                             lease_ttl_s=TTL_S, fork_branch="alt")
        assert other.branch == "alt" and other.forked and other.parent.id == start.parent.id
        await store.check_invariants(sid)
        reply_id, branch = await _commit(store, start, 1)
        assert branch == "main"
        session = await store.get_session(sid, tenant="acme")
        assert session.branches == {"main": reply_id, "alt": session.root_turn_id}
        assert await store.token_path(sid, reply_id, tenant="acme") == [1, 2, 11, 21]
        # The lease is gone: the next turn begins at the new head.
        nxt = await store.turns.begin_turn(sid, tenant="acme", lease_id="c", lease_ttl_s=TTL_S)
        assert nxt.parent.id == reply_id
        await _commit(store, other, 2)  # the forked branch commits beside it
        await store.check_invariants(sid)

    with_store(body)


def test_begin_checks_before_anything_runs(with_store: Callable[[StoreBody], None]) -> None:
    async def body(store: SessionStore) -> None:
        sid = await _session(store)
        start = await store.turns.begin_turn(sid, tenant="acme", lease_id="a", lease_ttl_s=TTL_S)
        root = start.parent.id
        reply_id, _ = await _commit(store, start, 1)
        with pytest.raises(HeadMoved):  # an explicit parent that is no longer the head
            await store.turns.begin_turn(sid, tenant="acme", lease_id="b", lease_ttl_s=TTL_S,
                                         branch="main", parent_turn_id=root)
        with pytest.raises(VersionConflict):
            await store.turns.begin_turn(sid, tenant="acme", lease_id="b", lease_ttl_s=TTL_S,
                                         expected_version=1)
        with pytest.raises(BranchNotFound):
            await store.turns.begin_turn(sid, tenant="acme", lease_id="b", lease_ttl_s=TTL_S,
                                         branch="nope")
        # A parent that heads no branch: no lease, and the reply moves no branch ...
        loose = await store.turns.begin_turn(sid, tenant="acme", lease_id="b",
                                             lease_ttl_s=TTL_S, parent_turn_id=root)
        assert loose.branch is None
        _, branch = await _commit(store, loose, 2)
        assert branch is None
        assert (await store.get_session(sid, tenant="acme")).branches == {"main": reply_id}
        # ... unless a fork is asked for (the compatible routes).
        forked = await store.turns.begin_turn(sid, tenant="acme", lease_id="c",
                                              lease_ttl_s=TTL_S, parent_turn_id=root,
                                              fork_branch="edit")
        assert forked.branch == "edit" and forked.forked

    with_store(body)


def test_lapsed_lease_and_moved_head_fall_back_to_a_fork(
        with_store: Callable[[StoreBody], None]) -> None:
    async def body(store: SessionStore) -> None:
        sid = await _session(store)
        slow = await store.turns.begin_turn(sid, tenant="acme", lease_id="a", lease_ttl_s=0.05)
        await asyncio.sleep(0.1)  # the lease lapses (a gateway that stalled)
        fast = await store.turns.begin_turn(sid, tenant="acme", lease_id="b", lease_ttl_s=TTL_S)
        fast_reply, _ = await _commit(store, fast, 1)
        assert not await store.turns.renew_lease(slow, TTL_S)  # no longer the slow turn's
        with pytest.raises(HeadMoved):
            await _commit(store, slow, 2)
        slow_reply, branch = await _commit(store, slow, 2, fork_branch="slow-1")
        session = await store.get_session(sid, tenant="acme")
        assert branch == "slow-1"
        assert session.branches == {"main": fast_reply, "slow-1": slow_reply}

    with_store(body)


def test_release_and_idempotent_commit(with_store: Callable[[StoreBody], None]) -> None:
    async def body(store: SessionStore) -> None:
        sid = await _session(store)
        start = await store.turns.begin_turn(sid, tenant="acme", lease_id="a", lease_ttl_s=TTL_S)
        assert await store.turns.renew_lease(start, TTL_S)
        await store.turns.release_lease(start)  # the turn failed: the branch is free again
        start = await store.turns.begin_turn(sid, tenant="acme", lease_id="b", lease_ttl_s=TTL_S)
        fields = {"request": "same"}
        first, _ = await store.turns.commit_turn(
            start, tenant="acme", turns=[("i" * 32, user(5)), ("o" * 32, assistant(6))],
            idempotency_key="k", request_fields=fields)
        again, _ = await store.turns.commit_turn(  # a retry whose reply differs (sampling)
            start, tenant="acme", turns=[("j" * 32, user(5)), ("p" * 32, assistant(7))],
            idempotency_key="k", request_fields=fields)
        assert [t.id for t in again] == [t.id for t in first]
        assert len(await store.get_tree(sid, tenant="acme")) == 3
        await store.check_invariants(sid)
        await store.delete_session(sid, tenant="acme")
        assert not await store.redis.exists(store.keys(sid).base + "leases")

    with_store(body)
