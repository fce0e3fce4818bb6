"""Idempotency keys: a retry returns the first result; reuse with another body is refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sessions import IdempotencyConflict, SessionStore
from tests.sessions.conftest import StoreBody
from tests.sessions.support import assistant, user

Run = Callable[[StoreBody], None]


def test_idempotent_append_replays_first_result(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        first = await store.append_turns(
            s.id, tenant="acme", turns=[user(1), assistant(2)], idempotency_key="k"
        )
        await store.append_turns(s.id, tenant="acme", turns=[user(3)])  # the head moves on
        again = await store.append_turns(
            s.id, tenant="acme", turns=[user(1), assistant(2)], idempotency_key="k"
        )
        assert again == first  # same turn ids, version and timestamps: the first result
        session = await store.get_session(s.id, tenant="acme")
        assert session.version == 3 and len(await store.get_tree(s.id, tenant="acme")) == 4
        with pytest.raises(IdempotencyConflict):
            await store.append_turns(s.id, tenant="acme", turns=[user(1)], idempotency_key="k")
        with pytest.raises(IdempotencyConflict):  # same key, another operation
            await store.fork(s.id, s.root_turn_id, "b", tenant="acme", idempotency_key="k")
        await store.check_invariants(s.id)

    with_store(body)


def test_idempotent_fork_rewind_and_create(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m", system_token_ids=[1], idempotency_key="c")
        assert (
            await store.create_session("acme", "m", system_token_ids=[1], idempotency_key="c") == s
        )
        with pytest.raises(IdempotencyConflict):
            await store.create_session("acme", "m", system_token_ids=[2], idempotency_key="c")
        other = await store.create_session(
            "umbrella", "m", system_token_ids=[1], idempotency_key="c"
        )
        assert other.id != s.id  # the key is scoped to the tenant
        (a,) = await store.append_turns(s.id, tenant="acme", turns=[user(1)])
        forked = await store.fork(s.id, a.id, "b", tenant="acme", idempotency_key="f")
        await store.append_turns(s.id, tenant="acme", turns=[user(2)], branch="b")
        assert await store.fork(s.id, a.id, "b", tenant="acme", idempotency_key="f") == forked
        rewound = await store.rewind(
            s.id, "main", s.root_turn_id, tenant="acme", idempotency_key="r"
        )
        await store.append_turns(s.id, tenant="acme", turns=[user(3)])
        again = await store.rewind(s.id, "main", s.root_turn_id, tenant="acme", idempotency_key="r")
        assert again == rewound and again.version == 5
        await store.check_invariants(s.id)

    with_store(body)
