"""SessionStore against a real Redis/Valkey: exact example tests of each operation and error."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from sessions import (
    BranchExists,
    BranchNotFound,
    HeadMoved,
    InvalidTreeOperation,
    NewTurn,
    SessionNotFound,
    SessionStore,
    TurnNotFound,
    VersionConflict,
)
from tests.sessions.conftest import StoreBody
from tests.sessions.support import assistant, keys_matching, user

Run = Callable[[StoreBody], None]
SYSTEM = [151_644, 8948, 198, 70_000, 4_000_000_000]  # ids above 65535 and near 2**32


def test_create_session_has_root_and_main(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        session = await store.create_session(
            "acme", "smollm2", system_token_ids=SYSTEM, system="be brief",
            tools=[{"name": "read_file"}], metadata={"agent": "x"},
        )  # fmt: skip
        assert session.version == 1 and session.branches == {"main": session.root_turn_id}
        assert (session.tenant, session.model, session.system) == ("acme", "smollm2", "be brief")
        assert session.tools == ({"name": "read_file"},) and session.metadata == {"agent": "x"}
        assert await store.get_session(session.id, tenant="acme") == session
        root = await store.get_turn(session.id, session.root_turn_id, tenant="acme")
        assert (root.role, root.parent_id, root.depth, root.seq) == ("root", None, 0, 0)
        assert root.token_ids == tuple(SYSTEM)
        assert await store.list_sessions("acme") == [session.id]
        await store.check_invariants(session.id)

    with_store(body)


def test_append_chain_and_token_path(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m", system_token_ids=SYSTEM)
        inp, out = await store.append_turns(
            s.id, tenant="acme", turns=[user(1, 2, 70_001), assistant(3)]
        )
        assert (inp.parent_id, out.parent_id) == (s.root_turn_id, inp.id)
        assert (inp.depth, out.depth, inp.seq, out.seq) == (1, 2, 1, 2)
        assert inp.version == out.version == 2 and inp.is_input and not out.is_input
        assert await store.get_turn(s.id, out.id, tenant="acme") == out
        assert (await store.get_session(s.id, tenant="acme")).head() == out.id
        (nxt,) = await store.append_turns(s.id, tenant="acme", turns=[user(9)])
        assert await store.token_path(s.id, nxt.id, tenant="acme") == [*SYSTEM, 1, 2, 70_001, 3, 9]
        assert await store.token_path(s.id, inp.id, tenant="acme") == [*SYSTEM, 1, 2, 70_001]
        ids = await store.path_turn_ids(s.id, nxt.id, tenant="acme")
        assert ids == [s.root_turn_id, inp.id, out.id, nxt.id]
        tree = await store.get_tree(s.id, tenant="acme")
        assert [(t.id, t.parent_id, t.num_tokens) for t in tree] == [
            (s.root_turn_id, None, 5), (inp.id, s.root_turn_id, 3), (out.id, inp.id, 1),
            (nxt.id, out.id, 1),
        ]  # fmt: skip
        assert await store.children(s.id, s.root_turn_id, tenant="acme") == [inp.id]
        await store.check_invariants(s.id)

    with_store(body)


def test_detached_input_then_fast_forward(with_store: Run) -> None:
    # The gateway may write the input turn without moving the head, then the assistant turn
    # under it with move_branch=True: the head fast-forwards over both.
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        (inp,) = await store.append_turns(s.id, tenant="acme", turns=[user(1)], move_branch=False)
        assert (await store.get_session(s.id, tenant="acme")).head() == s.root_turn_id
        (out,) = await store.append_turns(
            s.id, tenant="acme", turns=[assistant(2)], parent_turn_id=inp.id
        )
        assert (await store.get_session(s.id, tenant="acme")).head() == out.id
        await store.check_invariants(s.id)

    with_store(body)


def test_append_under_non_head_needs_a_fork(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        a, b = await store.append_turns(s.id, tenant="acme", turns=[user(1), assistant(2)])
        (c,) = await store.append_turns(s.id, tenant="acme", turns=[user(3)])
        with pytest.raises(HeadMoved) as info:  # a is behind the head: not a fast-forward
            await store.append_turns(s.id, tenant="acme", turns=[user(4)], parent_turn_id=a.id)
        assert (info.value.current_head, info.value.version) == (c.id, 3)
        with pytest.raises(HeadMoved):
            await store.append_turns(s.id, tenant="acme", turns=[user(4)], expected_head=b.id)
        (side,) = await store.append_turns(
            s.id, tenant="acme", turns=[user(4)], parent_turn_id=a.id, move_branch=False
        )
        await store.fork(s.id, a.id, "alt", tenant="acme")
        (d,) = await store.append_turns(s.id, tenant="acme", turns=[user(5)], branch="alt")
        assert d.parent_id == a.id and side.parent_id == a.id
        session = await store.get_session(s.id, tenant="acme")
        assert session.branches == {"main": c.id, "alt": d.id} and session.version == 6
        with pytest.raises(TurnNotFound):
            await store.append_turns(s.id, tenant="acme", turns=[user(6)], parent_turn_id="f" * 32)
        with pytest.raises(BranchNotFound):
            await store.append_turns(s.id, tenant="acme", turns=[user(6)], branch="nope")
        with pytest.raises(InvalidTreeOperation):
            await store.append_turns(s.id, tenant="acme", turns=[])
        await store.check_invariants(s.id)

    with_store(body)


def test_expected_version_is_checked(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        await store.append_turns(s.id, tenant="acme", turns=[user(1)], expected_version=1)
        with pytest.raises(VersionConflict) as info:
            await store.append_turns(s.id, tenant="acme", turns=[user(2)], expected_version=1)
        assert (info.value.expected, info.value.current) == (1, 2)
        with pytest.raises(VersionConflict):
            await store.fork(s.id, s.root_turn_id, "b", tenant="acme", expected_version=7)
        with pytest.raises(VersionConflict):
            await store.rewind(s.id, "main", s.root_turn_id, tenant="acme", expected_version=1)
        assert (await store.get_session(s.id, tenant="acme")).version == 2

    with_store(body)


def test_fork_and_rewind_errors(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        a, b = await store.append_turns(s.id, tenant="acme", turns=[user(1), assistant(2)])
        await store.fork(s.id, a.id, "side", tenant="acme")
        (c,) = await store.append_turns(s.id, tenant="acme", turns=[user(3)], branch="side")
        with pytest.raises(TurnNotFound):
            await store.fork(s.id, "0" * 32, "x", tenant="acme")
        with pytest.raises(BranchExists):
            await store.fork(s.id, b.id, "side", tenant="acme")
        with pytest.raises(InvalidTreeOperation):
            await store.fork(s.id, b.id, "bad name!", tenant="acme")
        with pytest.raises(InvalidTreeOperation):  # c is on "side", not an ancestor of main's head
            await store.rewind(s.id, "main", c.id, tenant="acme")
        with pytest.raises(BranchNotFound):
            await store.rewind(s.id, "nope", a.id, tenant="acme")
        with pytest.raises(HeadMoved):
            await store.rewind(s.id, "main", a.id, tenant="acme", expected_head=a.id)
        rewound = await store.rewind(s.id, "main", a.id, tenant="acme", expected_head=b.id)
        assert rewound.branches == {"main": a.id, "side": c.id}
        assert (await store.rewind(s.id, "main", a.id, tenant="acme")).version == 6  # to itself
        await store.check_invariants(s.id)

    with_store(body)


def test_tenant_isolation(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        (a,) = await store.append_turns(s.id, tenant="acme", turns=[user(1)], idempotency_key="k")
        calls = [
            store.get_session(s.id, tenant="evil"),
            store.get_turn(s.id, a.id, tenant="evil"),
            store.get_tree(s.id, tenant="evil"),
            store.children(s.id, a.id, tenant="evil"),
            store.token_path(s.id, a.id, tenant="evil"),
            store.path_turn_ids(s.id, a.id, tenant="evil"),
            store.read_events(s.id, tenant="evil"),
            store.append_turns(s.id, tenant="evil", turns=[user(1)], idempotency_key="k"),
            store.fork(s.id, a.id, "b", tenant="evil"),
            store.rewind(s.id, "main", a.id, tenant="evil"),
            store.delete_session(s.id, tenant="evil"),
        ]
        for call in calls:
            with pytest.raises(SessionNotFound):
                await call
        assert await store.list_sessions("evil") == []
        assert (await store.get_session(s.id, tenant="acme")).version == 2
        with pytest.raises(SessionNotFound):  # malformed ids are simply not found
            await store.get_session("../etc}:meta", tenant="acme")
        with pytest.raises(TurnNotFound):
            await store.get_turn(s.id, "x:y", tenant="acme")

    with_store(body)


def test_delete_removes_every_key(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        keep = await store.create_session("acme", "m")
        s = await store.create_session("acme", "m", system_token_ids=[1])
        (a,) = await store.append_turns(s.id, tenant="acme", turns=[user(2)], idempotency_key="k")
        await store.fork(s.id, a.id, "b", tenant="acme", idempotency_key="f")
        await store.append_turns(s.id, tenant="acme", turns=[assistant(3)], branch="b")
        base = store.keys(s.id).base
        assert len(await keys_matching(store, base + "*")) >= 9
        await store.delete_session(s.id, tenant="acme")
        assert await keys_matching(store, base + "*") == []
        assert await store.list_sessions("acme") == [keep.id]
        with pytest.raises(SessionNotFound):
            await store.get_session(s.id, tenant="acme")
        with pytest.raises(SessionNotFound):
            await store.delete_session(s.id, tenant="acme")
        await store.delete_session(keep.id, tenant="acme")
        assert await keys_matching(store, store.key_prefix + "*") == []

    with_store(body)


def test_events_record_each_mutation(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        (a,) = await store.append_turns(s.id, tenant="acme", turns=[user(1)])
        await store.fork(s.id, s.root_turn_id, "b", tenant="acme")
        await store.rewind(s.id, "main", s.root_turn_id, tenant="acme")
        events = await store.read_events(s.id, tenant="acme")
        assert [(e.type, e.fields["version"]) for e in events] == [
            ("session.created", "1"), ("turns.appended", "2"), ("branch.created", "3"),
            ("branch.moved", "4"),
        ]  # fmt: skip
        assert events[1].fields["turn_ids"] == a.id and events[1].fields["head"] == a.id
        assert events[3].fields["from"] == a.id
        later = await store.read_events(s.id, tenant="acme", after=events[1].id)
        assert [e.id for e in later] == [events[2].id, events[3].id]
        assert await store.read_events(s.id, tenant="acme", after=events[3].id, block_ms=10) == []
        # A blocked reader wakes up for the next mutation (ids order it, not timing).
        waiting = asyncio.create_task(
            store.read_events(s.id, tenant="acme", after=events[3].id, block_ms=5000)
        )
        await store.fork(s.id, a.id, "c", tenant="acme")
        (woken,) = await waiting
        assert (woken.type, woken.fields["branch"], woken.fields["version"]) == (
            "branch.created", "c", "5",
        )  # fmt: skip

    with_store(body)


def test_store_rejects_unsafe_configuration(redis_url: str) -> None:
    with pytest.raises(ValueError, match="decode_responses"):
        SessionStore(Redis.from_url(redis_url, decode_responses=True))
    with pytest.raises(ValueError, match="hash tag"):
        SessionStore(Redis.from_url(redis_url), key_prefix="test:{x}:")


def test_new_turn_payload_round_trips(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        turn = NewTurn(
            "assistant", [7, 8],
            messages=[{"role": "assistant", "content": "zé ✓ \n\"q\""}],
            tool_calls=[{"id": "c1", "name": "read", "arguments": "{\"p\": 1}"}],
            usage={"input_tokens": 3}, finish_reason="tool_calls",
        )  # fmt: skip
        (t,) = await store.append_turns(s.id, tenant="acme", turns=[turn])
        stored = await store.get_turn(s.id, t.id, tenant="acme")
        assert stored == t and stored.tool_calls[0]["arguments"] == '{"p": 1}'
        assert (
            stored.messages[0]["content"] == 'zé ✓ \n"q"' and stored.finish_reason == "tool_calls"
        )
        with pytest.raises(InvalidTreeOperation):
            await store.append_turns(
                s.id, tenant="acme", turns=[NewTurn("user", [1], messages=[{"x": object()}])]
            )

    with_store(body)


def test_works_over_resp2_too(redis_url: str, redis_key_prefix: str) -> None:
    # redis-py 8 speaks RESP3 by default; deployments may pin protocol=2. Replies differ in shape.
    async def body() -> None:
        client = Redis.from_url(redis_url, protocol=2)
        try:
            store = SessionStore(client, key_prefix=redis_key_prefix)
            s = await store.create_session("acme", "m", system_token_ids=[1])
            (a,) = await store.append_turns(s.id, tenant="acme", turns=[user(2)])
            await store.fork(s.id, a.id, "b", tenant="acme")
            assert (await store.get_session(s.id, tenant="acme")).branches == {
                "main": a.id, "b": a.id,
            }  # fmt: skip
            assert await store.get_turn(s.id, a.id, tenant="acme") == a
            assert await store.token_path(s.id, a.id, tenant="acme") == [1, 2]
            tree = await store.get_tree(s.id, tenant="acme")
            assert [t.id for t in tree] == [s.root_turn_id, a.id]
            events = await store.read_events(s.id, tenant="acme", after="0-0", block_ms=100)
            assert [e.type for e in events] == [
                "session.created", "turns.appended", "branch.created",
            ]  # fmt: skip
            await store.check_invariants(s.id)
            await store.delete_session(s.id, tenant="acme")
        finally:
            await client.aclose()

    asyncio.run(body())
