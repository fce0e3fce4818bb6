"""Optimistic concurrency over HTTP: racing appends with the same `If-Match` version. Exactly one
wins; the others are refused before anything is generated (the branch is leased by the turn in
progress, or its version has moved on)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sessions import SessionStore
from tests.gateway.conftest import Harness

NUM_CLIENTS = 20


def test_same_version_appends_exactly_one_wins(run_gateway: Callable[..., None]) -> None:
    async def body(h: Harness) -> None:
        created = (await h.client.post("/v1/sessions", json={"system": "Be brief."})).json()
        sid, version = created["id"], created["version"]

        async def append(i: int) -> tuple[int, dict[str, object]]:
            r = await h.client.post(
                f"/v1/sessions/{sid}/turns", headers={"If-Match": f'"v{version}"'},
                json={"messages": [{"role": "user", "content": f"client {i}"}],
                      "generate": {"max_tokens": 3}})
            return r.status_code, r.json()

        results = await asyncio.gather(*(append(i) for i in range(NUM_CLIENTS)))
        statuses = sorted(status for status, _ in results)
        assert statuses.count(200) == 1, statuses
        assert set(statuses) <= {200, 409, 412}, statuses
        losers = [b for status, b in results if status != 200]
        assert all(isinstance(b["error"], dict) and b["error"]["type"] in
                   ("version_conflict", "head_moved", "branch_busy") for b in losers), losers
        assert h.engine.stats().num_finished == 1  # the losers never reached the engine
        (winner,) = (b for status, b in results if status == 200)

        store = SessionStore(h.redis, key_prefix=h.settings.key_prefix)
        await store.check_invariants(sid)
        view = (await h.client.get(f"/v1/sessions/{sid}")).json()
        assistants = [t for t in view["turns"] if t["role"] == "assistant"]
        assert [t["id"] for t in assistants] == [winner["id"]]
        assert len(view["turns"]) == 3  # root, the winner's input turn, its reply
        assert view["branches"] == {"main": winner["id"]}

    run_gateway(body)
