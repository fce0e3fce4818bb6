"""A 5,000-turn session (written straight into the live server's store, with forks) opens in
under 2 s, reports every turn, and draws the end of the tree when scrolled there."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from sessions import SessionStore
from sessions.models import NewTurn
from sessions.redis_client import open_client
from tests.e2e.agents.live_serve import TENANT, LiveServer
from tests.ui.browser import SCROLL_TO_BOTTOM_JS
from tests.ui.conftest import OpenPage, UiReport
from tests.ui.tree_check import api_tree

NUM_TURNS = 5000  # below the root
MAIN_BATCH = 1000  # main grows by four batches of this; a fork of FORK_TURNS after each
FORK_TURNS = 250
LOAD_BOUND_S = 2.0
MEASURED_LOADS = 3
KEY_PREFIX = "rg:"  # serve's default

T = TypeVar("T")


def run_async(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine in a thread of its own (Playwright's sync API owns this thread's loop)."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = asyncio.run(make())
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=body, name="ui-store")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    value: T = out["value"]
    return value


def synthetic_turns(n: int, start: int, branch: str) -> list[NewTurn]:
    """`n` alternating user/assistant turns (user first), with usage like the gateway's."""
    turns = []
    for k in range(start, start + n):
        if k % 2 == 0:
            turns.append(NewTurn(role="user", token_ids=[11, 12, 13, 14, 15, 16],
                                 messages=[{"role": "user",
                                            "content": f"[{branch}] step {k}: next file?"}]))
            continue
        computed = 6 + k % 5
        usage = {"input_tokens": 40 + k * 10, "cached_tokens": 34 + k * 10 - computed % 3,
                 "computed_tokens": computed, "output_tokens": 4, "ttft_ms": 12.5 + k % 7,
                 "queue_ms": 0.25, "decode_ms": 40.0, "drafted_tokens": None,
                 "accepted_tokens": None}
        turns.append(NewTurn(role="assistant", token_ids=[21, 22, 23, 24],
                             messages=[{"role": "assistant",
                                        "content": f"[{branch}] answer {k}"}],
                             usage=usage, finish_reason="stop", worker="w0"))
    return turns


@dataclass(frozen=True)
class BigTree:
    session_id: str
    heads: dict[str, str]  # branch -> head turn (the tree's leaves)


async def build_big_tree(redis_url: str, model: str) -> BigTree:
    redis = open_client(redis_url)
    store = SessionStore(redis, key_prefix=KEY_PREFIX)
    try:
        session = await store.create_session(
            TENANT, model, system_token_ids=list(range(1, 33)),
            system="A synthetic agent session of 5,000 turns.",
            metadata={"synthetic": "5000 turns"})
        sid, built = session.id, 0
        for batch in range(NUM_TURNS // (MAIN_BATCH + FORK_TURNS)):
            main = await store.append_turns(sid, tenant=TENANT, branch="main",
                                            turns=synthetic_turns(MAIN_BATCH, built, "main"))
            built += MAIN_BATCH
            fork = f"fork-{batch}"
            await store.fork(sid, main[MAIN_BATCH // 2 + 1].id, fork, tenant=TENANT)
            await store.append_turns(sid, tenant=TENANT, branch=fork,
                                     turns=synthetic_turns(FORK_TURNS, 0, fork))
            built += FORK_TURNS
        assert built == NUM_TURNS
        final = await store.get_session(sid, tenant=TENANT)
        return BigTree(sid, dict(final.branches))
    finally:
        await redis.aclose()


def test_5000_turn_session_loads_fast(live_server: LiveServer, open_page: OpenPage,
                                      ui_report: UiReport) -> None:
    started = time.monotonic()
    tree = run_async(lambda: build_big_tree(str(live_server.process.pids()["valkey_url"]),
                                            live_server.model))
    build_s = time.monotonic() - started
    body, turns = api_tree(live_server.http, tree.session_id)
    assert body["num_turns"] == len(turns) == NUM_TURNS + 1
    leaves = set(tree.heads.values())
    assert len(leaves) == 5 and not leaves & {t["parent_id"] for t in turns}

    ui = open_page(live_server.url)
    page = ui.page
    ui.open("/")  # warm-up: the page's files and the listing
    page.wait_for_selector(f'#sessions [data-session-id="{tree.session_id}"]')
    ready = f'#tree[data-session-id="{tree.session_id}"][data-ready="1"]'
    loads = []
    for _ in range(MEASURED_LOADS):
        page.goto("about:blank")
        t0 = time.monotonic()
        ui.open(f"/s/{tree.session_id}")
        page.wait_for_selector(ready, state="attached", timeout=30_000)
        loads.append(time.monotonic() - t0)
    ui_report.timings["5000_turn_build_s"] = round(build_s, 3)
    ui_report.timings["5000_turn_load_s"] = [round(s, 3) for s in loads]
    median = statistics.median(loads)
    assert median < LOAD_BOUND_S, f"5,000-turn session: loads took {loads} s (median {median})"
    assert page.get_attribute("#tree", "data-num-turns") == str(NUM_TURNS + 1)

    drawn_top = set(page.eval_on_selector_all("#tree [data-turn-id]",
                                              "els => els.map(e => e.dataset.turnId)"))
    assert 0 < len(drawn_top) < 1000, f"{len(drawn_top)} rows in the DOM: not virtualized"
    ui_report.screenshot(page, "big_tree_1280x800.png")

    # Scrolled to the bottom (again on each poll: the rest of the tree may still be paging in
    # below the first view), the page draws the end of a branch.
    page.wait_for_function(
        f"(ids) => {{ ({SCROLL_TO_BOTTOM_JS})();"
        " return ids.some(id => document.querySelector(`#tree [data-turn-id=\"${id}\"]`)); }",
        arg=sorted(leaves - drawn_top), polling=200, timeout=15_000)
    drawn_bottom = set(page.eval_on_selector_all("#tree [data-turn-id]",
                                                 "els => els.map(e => e.dataset.turnId)"))
    assert len(drawn_bottom) < 1000 and drawn_bottom != drawn_top
    assert drawn_bottom & leaves, "scrolled to the bottom, no branch end is drawn"
    ui_report.screenshot(page, "big_tree_bottom_1280x800.png")
    assert not ui.console.unexpected(), ui.console.entries
