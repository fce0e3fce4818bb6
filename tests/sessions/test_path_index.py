"""The path index against a real Redis: what a path hash ignores and keeps, anchors found per
session and tenant-wide, tenancy, and cleanup when a session is deleted."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sessions import SessionNotFound, SessionStore, path_hashes, root_path_hash
from sessions.keys import tenant_paths_key
from sessions.path_index import canonical_message, extend_path_hash
from tests.sessions.conftest import StoreBody
from tests.sessions.support import assistant, keys_matching, user

Run = Callable[[StoreBody], None]
ROOT = root_path_hash(model="m", system="be brief")
CALL = {"role": "assistant", "content": "Checking.",
        "tool_calls": [{"id": "call_1", "name": "f", "arguments": {"a": 1, "b": [2]}}]}


def test_hash_keeps_what_the_model_reads_and_ignores_the_rest() -> None:
    same_call = {"role": "assistant", "content": "  Checking.\n", "tool_calls": [
        {"id": "toolu_other", "name": "f", "arguments": '{"b": [2], "a": 1}'}]}
    assert canonical_message(CALL) == canonical_message(same_call)
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
    assert canonical_message(tool) == canonical_message({**tool, "tool_call_id": "x"})
    blocks = {"role": "user", "content": [{"type": "text", "text": "hi",
                                           "cache_control": {"type": "ephemeral"}}]}
    assert canonical_message(blocks) == canonical_message({"role": "user", "content": "hi"})
    for changed in ({"role": "user", "content": "hi "}, {"role": "system", "content": "hi"},
                    {**CALL, "tool_calls": [{"name": "f", "arguments": {"a": 2}}]}):
        assert canonical_message(changed) != canonical_message(blocks) != canonical_message(CALL)
    assert root_path_hash(model="m", system="be brief") == ROOT
    assert ROOT != root_path_hash(model="m", system="be brief", tools=[{"name": "f"}])
    openai_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    anthropic_tool = {"name": "f", "input_schema": {"type": "object"}}
    assert root_path_hash(model="m", system=None, tools=[openai_tool]) == root_path_hash(
        model="m", system=None, tools=[anthropic_tool])
    hashes = path_hashes(ROOT, [blocks, CALL])
    assert hashes[0] == ROOT and hashes[2] == extend_path_hash(hashes[1], CALL)
    assert len(set(hashes)) == 3 and all(len(h) == 32 for h in hashes)


def test_find_the_deepest_anchor(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        session = await store.create_session("acme", "m", system_token_ids=[1])
        u1, a1, _, a2 = await store.append_turns(
            session.id, tenant="acme", turns=[user(2), assistant(3), user(4), assistant(5)])
        messages = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "r1"},
                    {"role": "user", "content": "q2"}, {"role": "assistant", "content": "r2"},
                    {"role": "user", "content": "q3"}]
        h = path_hashes(ROOT, messages)
        index = store.paths
        await index.record("acme", session.id, {h[0]: session.root_turn_id}, tenant_wide=False)
        await index.record("acme", session.id, {h[2]: a1.id, h[4]: a2.id})
        await index.check_invariants(session.id)
        found = await index.find("acme", h[:-1])  # deepest first
        assert [(f.session_id, f.turn_id, f.num_matched) for f in found] == [
            (session.id, a2.id, 4), (session.id, a1.id, 2)]
        edited = path_hashes(ROOT, [*messages[:2], {"role": "user", "content": "EDITED"}])
        (found_edit,) = await index.find("acme", edited[:-1])
        assert (found_edit.turn_id, found_edit.num_matched) == (a1.id, 2)
        # The root is found only within a named session.
        assert await index.find("acme", [h[0], h[1]]) == []
        (in_session,) = await index.find("acme", [h[0], h[1]], session_id=session.id)
        assert in_session.turn_id == session.root_turn_id
        # Another tenant sees nothing, and cannot write into the session.
        assert await index.find("evil", h[:-1]) == []
        assert await index.find("evil", h[:-1], session_id=session.id) == []
        with pytest.raises(SessionNotFound):
            await index.record("evil", session.id, {h[1]: u1.id})
        assert await store.redis.hget(store.keys(session.id).paths, h[1]) is None

    with_store(body)


def test_delete_session_drops_its_index(with_store: Run) -> None:
    async def body(store: SessionStore) -> None:
        old = await store.create_session("acme", "m", system_token_ids=[1])
        new = await store.create_session("acme", "m", system_token_ids=[1])
        (a_old,) = await store.append_turns(old.id, tenant="acme", turns=[assistant(2)])
        (a_new,) = await store.append_turns(new.id, tenant="acme", turns=[assistant(2)])
        shared, only_old = extend_path_hash(ROOT, CALL), extend_path_hash(ROOT, {"role": "x"})
        await store.paths.record("acme", old.id, {shared: a_old.id, only_old: a_old.id})
        await store.paths.record("acme", new.id, {shared: a_new.id})  # the latest session wins
        await store.delete_session(old.id, tenant="acme")
        assert await keys_matching(store, f"{store.key_prefix}{{{old.id}}}:*") == []
        tenant_key = tenant_paths_key(store.key_prefix, "acme")
        assert await store.redis.hgetall(tenant_key) == {
            shared.encode(): f"{new.id}:{a_new.id}".encode()}
        (found,) = await store.paths.find("acme", [ROOT, shared])
        assert found.session_id == new.id and found.turn_id == a_new.id
        await store.delete_session(new.id, tenant="acme")
        assert await store.redis.exists(tenant_key) == 0

    with_store(body)
