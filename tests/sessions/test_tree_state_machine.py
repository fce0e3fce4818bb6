"""Stateful property test: the real Redis store against a pure-Python model of the session trees.

Every step runs one operation on both. The machine predicts the outcome (result or typed error)
from the model, in the same order of checks as the Lua scripts; after every step the invariant
compares versions, branches, turn parents, creation order and token paths, and runs the store's
own `check_invariants`. Each machine owns an `asyncio.Runner`, so the async store runs in one
loop per example, and a key prefix of its own that teardown deletes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis.asyncio import Redis

from sessions import (
    IdempotencyConflict,
    NewTurn,
    Session,
    SessionNotFound,
    SessionStore,
)
from sessions.keys import tenant_index_key
from sessions.models import MAX_TOKEN_ID
from tests.sessions.support import keys_matching
from tests.sessions.tree_model import ModelSession, Request

T = TypeVar("T")
TENANTS = ("acme", "umbrella")
UNKNOWN_TURN = "0" * 32
token_ids = st.lists(
    st.integers(0, MAX_TOKEN_ID) | st.sampled_from([0, 65_535, 65_536, MAX_TOKEN_ID]), max_size=3
)
new_turns = st.lists(
    st.builds(
        NewTurn, role=st.sampled_from(["user", "tool", "assistant", "system"]), token_ids=token_ids
    ),
    min_size=1,
    max_size=3,
)
idempotency_keys = st.sampled_from([None, None, None, "k1", "k2", "k3"])


def mostly(values: Sequence[T], rare: T) -> st.SearchStrategy[T]:
    """One of `values`, or (about one time in eight) the `rare` value that makes the call fail."""
    return st.sampled_from([*values] * 7 + [rare]) if values else st.just(rare)


class SessionTreeMachine(RuleBasedStateMachine):
    def __init__(self, redis_url: str) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.prefix = f"test:{uuid.uuid4().hex}:"
        self.store = SessionStore(Redis.from_url(redis_url), key_prefix=self.prefix)
        self.sessions: dict[str, ModelSession] = {}
        self.created: dict[tuple[str, str], tuple[tuple[str, tuple[int, ...]], Session]] = {}

    def run(self, coro: Awaitable[T]) -> T:
        async def wrapper() -> T:
            return await coro

        return self.runner.run(wrapper())

    def teardown(self) -> None:
        try:
            self.run(self._assert_no_stray_keys_then_clean())
        finally:
            self.runner.close()

    async def _assert_no_stray_keys_then_clean(self) -> None:
        keys = await keys_matching(self.store, self.prefix + "*")
        try:
            allowed = {tenant_index_key(self.prefix, t) for t in TENANTS}
            bases = tuple(self.store.keys(sid).base for sid in self.sessions)
            stray = [k for k in keys if k not in allowed and not k.startswith(bases or ("\0",))]
            assert not stray, f"keys left by deleted sessions: {stray}"
        finally:
            for start in range(0, len(keys), 500):
                await self.store.redis.unlink(*keys[start : start + 500])
            await self.store.redis.aclose()

    def pick(self, data: st.DataObject, min_turns: int = 0) -> ModelSession:
        # Creation order, not sorted ids: ids are random, draws must not depend on them.
        sids = [sid for sid, m in self.sessions.items() if len(m.order) >= min_turns]
        return self.sessions[data.draw(st.sampled_from(sids), label="session")]

    # ---- rules ------------------------------------------------------------------------------

    @precondition(lambda self: len(self.sessions) < 2)
    @rule(
        tenant=st.sampled_from(TENANTS),
        model=st.sampled_from(["m1", "m2"]),
        system=token_ids,
        key=st.none() | st.sampled_from(["c1", "c2"]),
    )
    def create(self, tenant: str, model: str, system: list[int], key: str | None) -> None:
        request = (model, tuple(system))
        call = self.store.create_session(
            tenant, model, system_token_ids=system, idempotency_key=key
        )
        if key is not None and (tenant, key) in self.created:
            first_request, first = self.created[(tenant, key)]
            if first_request != request:
                with pytest.raises(IdempotencyConflict):
                    self.run(call)
            else:
                assert self.run(call) == first
            return
        session = self.run(call)
        assert session.version == 1 and session.branches == {"main": session.root_turn_id}
        root = session.root_turn_id
        self.sessions[session.id] = ModelSession(
            sid=session.id, tenant=tenant, root=root, parent={root: None},
            tokens={root: tuple(system)}, branches={"main": root}, order=[root],
        )  # fmt: skip
        if key is not None:
            self.created[(tenant, key)] = (request, session)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), turns=new_turns, move=st.booleans(), key=idempotency_keys)
    def append(
        self, data: st.DataObject, turns: list[NewTurn], move: bool, key: str | None
    ) -> None:
        m = self.pick(data)
        branch = data.draw(mostly(sorted(m.branches), "zz"), label="branch")
        parent = data.draw(st.none() | mostly(m.order, UNKNOWN_TURN), label="parent")
        kwargs = {
            "turns": turns, "branch": branch, "parent_turn_id": parent, "move_branch": move,
            "expected_version": self.draw_expected_version(data, m),
            "expected_head": self.draw_expected_head(data, m, branch),
        }  # fmt: skip
        self.mutate(m, ("append", kwargs), key)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), name=st.sampled_from(["b1", "b2", "b3", "main"]), key=idempotency_keys)
    def fork(self, data: st.DataObject, name: str, key: str | None) -> None:
        m = self.pick(data)
        turn = data.draw(mostly(m.order, UNKNOWN_TURN), label="from")
        kwargs = {
            "from_turn_id": turn, "new_branch": name,
            "expected_version": self.draw_expected_version(data, m),
        }  # fmt: skip
        self.mutate(m, ("fork", kwargs), key)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), key=idempotency_keys)
    def rewind(self, data: st.DataObject, key: str | None) -> None:
        m = self.pick(data)
        branch = data.draw(mostly(sorted(m.branches), "zz"), label="branch")
        line = m.path(m.branches[branch]) if branch in m.branches else m.order
        off_line = [t for t in m.order if t not in line] or line  # the non-ancestors, if any
        to = data.draw(st.sampled_from(line) | mostly(off_line, UNKNOWN_TURN), label="to")
        kwargs = {
            "branch": branch, "to_turn_id": to,
            "expected_version": self.draw_expected_version(data, m),
            "expected_head": self.draw_expected_head(data, m, branch),
        }  # fmt: skip
        self.mutate(m, ("rewind", kwargs), key)

    @precondition(lambda self: any(m.idem for m in self.sessions.values()))
    @rule(data=st.data())
    def replay(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from([s for s, m in self.sessions.items() if m.idem]))
        m = self.sessions[sid]
        key = data.draw(st.sampled_from(sorted(m.idem)), label="key")
        self.mutate(m, m.idem[key][0], key)

    # Only sessions with some history get deleted, so trees grow before they go.
    @precondition(lambda self: any(len(m.order) >= 6 for m in self.sessions.values()))
    @rule(data=st.data(), as_owner=st.booleans())
    def delete(self, data: st.DataObject, as_owner: bool) -> None:
        m = self.pick(data, min_turns=6)
        if not as_owner:
            other = next(t for t in TENANTS if t != m.tenant)
            with pytest.raises(SessionNotFound):
                self.run(self.store.delete_session(m.sid, tenant=other))
            return
        self.run(self.store.delete_session(m.sid, tenant=m.tenant))
        del self.sessions[m.sid]
        self.created = {k: v for k, v in self.created.items() if v[1].id != m.sid}
        assert self.run(keys_matching(self.store, self.store.keys(m.sid).base + "*")) == []

    # ---- model ------------------------------------------------------------------------------

    def draw_expected_version(self, data: st.DataObject, m: ModelSession) -> int | None:
        stale = m.version - 1  # one draw in five fails the check
        choices = [None, None, m.version, m.version, stale]
        return data.draw(st.sampled_from(choices), label="if_match")

    def draw_expected_head(self, data: st.DataObject, m: ModelSession, branch: str) -> str | None:
        head = m.branches.get(branch, m.root)
        # One draw in four names any turn, which usually is not the head.
        if data.draw(st.integers(0, 3), label="exp_head_any"):
            return data.draw(st.sampled_from([None, None, head]), label="exp_head")
        return data.draw(st.sampled_from(m.order), label="exp_head")

    def invoke(self, m: ModelSession, request: Request, key: str | None) -> Awaitable[Any]:
        op, kwargs = request
        methods: dict[str, Callable[..., Awaitable[Any]]] = {
            "append": self.store.append_turns, "fork": self.store.fork, "rewind": self.store.rewind,
        }  # fmt: skip
        method = methods[op]
        result: Awaitable[Any] = method(m.sid, tenant=m.tenant, idempotency_key=key, **kwargs)
        return result

    def mutate(self, m: ModelSession, request: Request, key: str | None) -> None:
        if key is not None and key in m.idem:
            first_request, first_result = m.idem[key]
            if first_request == request:
                assert self.run(self.invoke(m, request, key)) == first_result
            else:
                with pytest.raises(IdempotencyConflict):
                    self.run(self.invoke(m, request, key))
            return
        error = m.predict_error(request)
        if error is not None:
            with pytest.raises(error):
                self.run(self.invoke(m, request, key))
            return
        result = self.run(self.invoke(m, request, key))
        m.version += 1
        m.apply(request, result)
        if key is not None:
            m.idem[key] = (request, result)

    @invariant()
    def store_matches_model(self) -> None:
        # Concurrent reads over the pool: one step costs a few round trips, not dozens.
        async def compare_all() -> None:
            await asyncio.gather(*(self.compare(m) for m in self.sessions.values()))

        self.run(compare_all())

    async def compare(self, m: ModelSession) -> None:
        store, sid, tenant = self.store, m.sid, m.tenant
        probes = sorted({*m.branches.values(), m.order[-1]})
        other = next(t for t in TENANTS if t != tenant)
        session, tree, paths, id_paths, _, foreign = await asyncio.gather(
            store.get_session(sid, tenant=tenant),
            store.get_tree(sid, tenant=tenant),
            asyncio.gather(*(store.token_path(sid, t, tenant=tenant) for t in probes)),
            asyncio.gather(*(store.path_turn_ids(sid, t, tenant=tenant) for t in probes)),
            store.check_invariants(sid),
            store.get_tree(sid, tenant=other),
            return_exceptions=True,
        )
        for value in (session, tree, paths, id_paths, _):
            if isinstance(value, BaseException):
                raise value
        assert isinstance(foreign, SessionNotFound), "another tenant must not see the session"
        assert (session.version, dict(session.branches)) == (m.version, m.branches)
        assert [t.id for t in tree] == m.order
        assert {t.id: t.parent_id for t in tree} == m.parent
        assert paths == [m.token_path(t) for t in probes]
        assert id_paths == [m.path(t) for t in probes]


def test_session_tree_matches_model(redis_url: str) -> None:
    run_state_machine_as_test(
        lambda: SessionTreeMachine(redis_url),  # type: ignore[arg-type]  # a factory is documented
        settings=settings(
            max_examples=15,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
