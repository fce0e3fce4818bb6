"""Concurrent mutations: the Lua scripts serialize them, optimistic checks pick one winner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sessions import HeadMoved, SessionStore, Turn, VersionConflict
from tests.sessions.conftest import StoreBody
from tests.sessions.support import user

Run = Callable[[StoreBody], None]
N = 20


def _split(
    results: list[list[Turn] | BaseException],
) -> tuple[list[list[Turn]], list[BaseException]]:
    wins = [r for r in results if not isinstance(r, BaseException)]
    losses = [r for r in results if isinstance(r, BaseException)]
    return wins, losses


@pytest.mark.parametrize("guard", ["expected_version", "expected_head"])
def test_one_of_twenty_guarded_appends_wins(with_store: Run, guard: str) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m", system_token_ids=[1])
        (a,) = await store.append_turns(s.id, tenant="acme", turns=[user(2)])
        by_version = guard == "expected_version"
        results = await asyncio.gather(
            *(
                store.append_turns(
                    s.id,
                    tenant="acme",
                    turns=[user(100 + i)],
                    expected_version=2 if by_version else None,
                    expected_head=None if by_version else a.id,
                )  # fmt: skip
                for i in range(N)
            ),
            return_exceptions=True,
        )
        wins, losses = _split(results)
        assert len(wins) == 1, results
        expected_error = VersionConflict if by_version else HeadMoved
        assert all(isinstance(e, expected_error) for e in losses), losses
        session = await store.get_session(s.id, tenant="acme")
        assert session.version == 3 and session.head() == wins[0][0].id
        assert len(await store.get_tree(s.id, tenant="acme")) == 3
        await store.check_invariants(s.id)

    with_store(body)


def test_twenty_unguarded_appends_form_one_chain(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        results = await asyncio.gather(
            *(store.append_turns(s.id, tenant="acme", turns=[user(i)]) for i in range(N))
        )
        turns = sorted((r[0] for r in results), key=lambda t: t.seq)
        assert [t.depth for t in turns] == list(range(1, N + 1))
        assert [t.parent_id for t in turns] == [s.root_turn_id] + [t.id for t in turns[:-1]]
        session = await store.get_session(s.id, tenant="acme")
        assert session.version == N + 1 and session.head() == turns[-1].id
        path = await store.token_path(s.id, turns[-1].id, tenant="acme")
        assert path == [t.token_ids[0] for t in turns]
        await store.check_invariants(s.id)

    with_store(body)


def test_concurrent_idempotent_retries_write_once(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        s = await store.create_session("acme", "m")
        results = await asyncio.gather(
            *(
                store.append_turns(s.id, tenant="acme", turns=[user(7)], idempotency_key="same")
                for _ in range(N)
            )
        )
        assert all(r == results[0] for r in results)
        assert (await store.get_session(s.id, tenant="acme")).version == 2
        assert len(await store.get_tree(s.id, tenant="acme")) == 2
        await store.check_invariants(s.id)

    with_store(body)
