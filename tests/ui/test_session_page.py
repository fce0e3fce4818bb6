"""/ui against a live server and the real model: a coding-agent session (tool calls, tool
results, a fork, a rewind) drawn exactly as the API reports it, live updates while a turn
generates, fork/rewind/delete from the page, not-found, and the overview page.

The session is built once for the module by the SDK's `AgentLoop` over the tools of
examples/coding_agent.py (read-only ones), in a throwaway folder:

    root -- user -- a1(list_files) -- tool -- a2(read_file) -- tool -- a3 (answer)
                     `-- [alt] tool (other result) -- aA
    main is rewound to a2; then (test 2) a live append adds tool -- a4 under a2 on main.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import sdk
from examples.coding_agent import FILES, Sandbox
from tests.e2e.agents.live_serve import LiveServer
from tests.ui.browser import WATCH_LIVE_TEXT_JS, first_number, resource_status_error, squash
from tests.ui.conftest import PHONE, OpenPage, UiReport
from tests.ui.tree_check import api_tree, wait_until_agrees

TASK = ("greet.py crashes. Find out why, one tool call per step: 1. list_files to see the "
        "workspace. 2. read_file greet.py. Then explain the bug.")
FORK_BRANCH = "alt"
LIVE_MAX_TOKENS = 48
POLL_S = 15.0


@dataclass(frozen=True)
class AgentTree:
    session_id: str
    tag: str  # a unique metadata value (the sessions search finds the session by it)
    user: str
    assistants: tuple[str, str, str]  # a1 (list_files), a2 (read_file), a3 (answer)
    fork_input: str  # the tool turn on FORK_BRANCH
    fork_turn: str  # the assistant turn on FORK_BRANCH


def tool_messages_for(turn: sdk.Turn, content: str) -> list[dict[str, Any]]:
    """Tool results answering every call of `turn` with `content`."""
    return [{"role": "tool", "tool_call_id": call["id"], "content": content}
            for call in turn.tool_calls]


@pytest.fixture(scope="module")
def agent_tree(live_server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> AgentTree:
    folder: Path = tmp_path_factory.mktemp("sandbox")
    for name, text in FILES.items():
        (folder / name).write_text(text)
    box = Sandbox(folder)
    tag = f"ui-{uuid.uuid4().hex[:10]}"
    with sdk.Client(live_server.url) as client:
        loop = sdk.AgentLoop.create(
            client, [box.list_files, box.read_file, box.write_file],
            system="You are a coding agent. Use the tools to inspect the workspace.",
            metadata={"example": "coding_agent", "test": tag}, max_turns=3,
            # 40 tokens: room for one complete tool call of the 135M model
            generate={"max_tokens": 40, "parallel_tool_calls": False})
        result = loop.run(TASK, tool_choice=[{"name": "list_files"}, {"name": "read_file"},
                                             "none"])
        turns = [record.turn for record in result.turns]
        assert len(turns) == 3, sdk.turn_table(result.turns)
        a1, a2, a3 = turns
        assert [c["name"] for c in a1.tool_calls] == ["list_files"], a1
        assert [c["name"] for c in a2.tool_calls] == ["read_file"], a2
        assert not a3.tool_calls and result.stop_reason == "answered", a3
        session = loop.session
        session.fork(a1.id, FORK_BRANCH)
        with session.stream(tool_messages_for(a1, "error: the workspace is locked by another "
                                              "process"), branch=FORK_BRANCH, max_tokens=24,
                            tool_choice="none") as stream:
            for _ in stream:
                pass
            fork_turn = stream.get_final_turn()
        session.rewind("main", a2.id)
    assert a1.parent_id is not None and fork_turn.parent_id is not None
    return AgentTree(session.id, tag, a1.parent_id, (a1.id, a2.id, a3.id),
                     fork_turn.parent_id, fork_turn.id)


def wait_ready(page: Any, session_id: str) -> None:
    page.wait_for_selector(f'#tree[data-session-id="{session_id}"][data-ready="1"]',
                           state="attached")


def click_turn(page: Any, turn_id: str) -> None:
    """Click a drawn turn and wait for its detail panel."""
    page.locator(f'#tree [data-turn-id="{turn_id}"]').first.click()
    page.wait_for_selector(f'#turn-detail[data-turn-id="{turn_id}"]')


def wait_for_api(check: Any, what: str, page: Any, timeout_s: float = POLL_S) -> Any:
    """Poll `check()` (truthy: done) while the page keeps running; fails naming `what`."""
    waited = 0.0
    while waited < timeout_s:
        value = check()
        if value:
            return value
        page.wait_for_timeout(200)
        waited += 0.2
    raise AssertionError(f"timed out waiting for {what}")


def assert_console_clean(ui: Any, *allowed: Any) -> None:
    unexpected = ui.console.unexpected(*allowed)
    assert not unexpected, "console errors/warnings on the page:\n  " + "\n  ".join(unexpected)


@pytest.mark.slow
def test_session_page_draws_the_api_tree(live_server: LiveServer, agent_tree: AgentTree,
                                         open_page: OpenPage, ui_report: UiReport) -> None:
    sid = agent_tree.session_id
    ui = open_page(live_server.url)
    page = ui.page

    # The sessions list links to it; the search finds it by a metadata value.
    ui.open("/")
    row = page.locator(f'#sessions [data-session-id="{sid}"]')
    row.wait_for()
    link = f"#/s/{sid}"
    href = row.evaluate("(el) => (el.closest('a') || el.querySelector('a') || el)"
                        ".getAttribute('href')")
    assert href is not None and href.endswith(link), f"session row links to {href!r}"
    ui_report.screenshot(page, "sessions_1280x800.png")
    page.fill("input#session-search", agent_tree.tag.upper())  # case-insensitive
    page.wait_for_function(
        "(sid) => { const ids = [...document.querySelectorAll('#sessions [data-session-id]')]"
        ".map(e => e.dataset.sessionId); return ids.length === 1 && ids[0] === sid; }", arg=sid)
    row.click()
    wait_ready(page, sid)
    assert page.url.endswith(link), page.url

    # Nodes, edges, branch heads and every assistant turn's numbers, as the API says.
    body, turns = wait_until_agrees(page, live_server.http, sid)
    assert page.get_attribute("#tree", "data-num-turns") == str(body["num_turns"])
    assert body["num_turns"] == len(turns) == 9, [t["role"] for t in turns]
    assert body["session"]["branches"] == {"main": agent_tree.assistants[1],
                                           FORK_BRANCH: agent_tree.fork_turn}
    by_id = {t["id"]: t for t in turns}
    assert [c["name"] for c in by_id[agent_tree.assistants[0]]["tool_calls"]] == ["list_files"]
    assert by_id[agent_tree.fork_input]["role"] == "tool"

    # The fork's turn: its messages and the text the engine computed for it.
    click_turn(page, agent_tree.fork_turn)
    turn = live_server.http.get(f"/v1/sessions/{sid}/turns/{agent_tree.fork_turn}").json()
    computed = live_server.http.get(
        f"/v1/sessions/{sid}/turns/{agent_tree.fork_turn}/computed").json()
    detail = page.locator("#turn-detail")
    assert detail.locator(".message").count() == len(turn["messages"]) >= 1, turn["messages"]
    shown_delta = squash(page.text_content("#computed-delta"))
    assert shown_delta, "#computed-delta is empty"
    assert computed["computed_text"], computed
    assert squash(computed["computed_text"]) in shown_delta, (shown_delta, computed)
    ui_report.screenshot(page, "session_1280x800.png")

    # A phone-width page opened on the turn's own route.
    phone = open_page(live_server.url, PHONE)
    phone.open(f"/s/{sid}/t/{agent_tree.fork_turn}")
    wait_ready(phone.page, sid)
    phone.page.wait_for_selector(f'#turn-detail[data-turn-id="{agent_tree.fork_turn}"]')
    ui_report.screenshot(phone.page, "session_390x844.png")
    ui_report.screenshot(phone.page, "session_390x844_full.png", full_page=True)

    assert_console_clean(ui)
    assert_console_clean(phone)

    # The detail panel reads GET .../turns/{id}: its usage is the tree's (the decode rate too).
    tree_usage = by_id[agent_tree.fork_turn]["usage"]
    assert turn["usage"] is not None
    differ = {k: (turn["usage"].get(k, "<absent>"), v) for k, v in tree_usage.items()
              if turn["usage"].get(k, "<absent>") != v}
    assert not differ, f"GET turn usage vs tree usage (turn, tree): {differ}"


@pytest.mark.slow
def test_live_append_then_fork_rewind_delete_from_the_page(
        live_server: LiveServer, agent_tree: AgentTree, open_page: OpenPage,
        ui_report: UiReport) -> None:
    sid = agent_tree.session_id
    a1, a2, _ = agent_tree.assistants
    http = live_server.http
    ui = open_page(live_server.url)
    page = ui.page
    ui.open(f"/s/{sid}")
    wait_ready(page, sid)
    page.wait_for_selector('#tree[data-live="1"]', state="attached")
    page.evaluate("() => { window.__sameDocument = true; }")
    page.evaluate(WATCH_LIVE_TEXT_JS)

    # A streamed append on main while the page is open: it must appear without a reload.
    appended: dict[str, Any] = {}

    def append() -> None:
        try:
            with sdk.Client(live_server.url) as client:
                session = client.sessions.get(sid)
                parent = session.get_turn(a2)
                with session.stream(tool_messages_for(parent, FILES["greet.py"]),
                                    branch="main", max_tokens=LIVE_MAX_TOKENS,
                                    tool_choice="none") as stream:
                    for _ in stream:
                        pass
                    appended["turn"] = stream.get_final_turn()
        except BaseException as exc:  # reported by the test thread
            appended["error"] = exc

    worker = threading.Thread(target=append, name="ui-live-append")
    worker.start()
    while worker.is_alive():
        page.wait_for_timeout(100)  # the page runs on; Playwright handles its events
    worker.join()
    if "error" in appended:
        raise appended["error"]
    a4: sdk.Turn = appended["turn"]
    assert a4.parent_id is not None
    page.wait_for_selector(f'#tree [data-turn-id="{a4.id}"]', state="attached")
    page.wait_for_selector(f'#tree [data-turn-id="{a4.parent_id}"]', state="attached")
    assert page.evaluate("() => window.__sameDocument === true"), "the page was reloaded"
    assert page.get_attribute("#tree", "data-live") == "1"
    body, _ = wait_until_agrees(page, http, sid)
    assert body["session"]["branches"]["main"] == a4.id
    seen = page.evaluate("() => window.__liveSeen")
    assert any(turn_id == a4.parent_id for turn_id, _ in seen), (
        f"#live-text never showed text for input turn {a4.parent_id} while it generated "
        f"(seen: {seen[:3]})")
    click_turn(page, a4.id)
    page.wait_for_selector("#live-text", state="hidden", timeout=10_000)  # it lingers briefly
    ui_report.screenshot(page, "coding_agent_tree.png")

    # Fork from the page.
    click_turn(page, a1)
    page.fill("input[name=branch-name]", "ui-fork")
    page.click("button[data-action=fork]")
    wait_for_api(lambda: api_tree(http, sid)[0]["session"]["branches"].get("ui-fork") == a1,
                 "the fork made from the page", page)
    page.wait_for_selector(f'[data-head-branch="ui-fork"][data-head-turn="{a1}"]',
                           state="attached")

    # Rewind main from the page (to a1, an ancestor of its head a4).
    page.locator(f'#tree [data-turn-id="{a1}"]').first.click()
    page.wait_for_selector(f'#turn-detail[data-turn-id="{a1}"]')
    page.select_option("select[name=rewind-branch]", "main")
    page.click("button[data-action=rewind]")
    wait_for_api(lambda: api_tree(http, sid)[0]["session"]["branches"]["main"] == a1,
                 "the rewind made from the page", page)
    page.wait_for_selector(f'[data-head-branch="main"][data-head-turn="{a1}"]',
                           state="attached")
    body, _ = wait_until_agrees(page, http, sid)
    assert body["session"]["branches"] == {"main": a1, FORK_BRANCH: agent_tree.fork_turn,
                                           "ui-fork": a1}

    # Delete from the page (the confirm dialog is accepted): the API forgets the session.
    page.click("button[data-action=delete-session]")
    wait_for_api(lambda: http.get(f"/v1/sessions/{sid}").status_code == 404,
                 "the session deleted from the page to answer 404", page)
    page.wait_for_timeout(500)  # what the page does after the delete reaches the console
    assert_console_clean(ui)


def test_unknown_session_shows_not_found(live_server: LiveServer,
                                         open_page: OpenPage) -> None:
    ui = open_page(live_server.url)
    ui.open(f"/s/nosuchsession{uuid.uuid4().hex[:8]}")
    not_found = ui.page.locator("#not-found")
    not_found.wait_for(state="visible")
    assert "not found" in (not_found.text_content() or "").lower()
    assert_console_clean(ui, resource_status_error(404))  # the browser logs the 404 answer


@pytest.mark.slow
def test_overview_page(live_server: LiveServer, agent_tree: AgentTree, open_page: OpenPage,
                       ui_report: UiReport) -> None:
    overview = live_server.http.get("/v1/ui/overview", params={"window_s": 3600}).json()
    assert overview["totals"]["num_turns"] >= 4, overview["totals"]  # the agent's turns
    ui = open_page(live_server.url)
    ui.open("/overview")
    page = ui.page
    page.wait_for_selector("#overview")
    for chart in ("hit_rate", "ttft", "tokens_per_s"):
        page.wait_for_selector(f'#overview [data-chart="{chart}"]', state="attached")
    for stat in ("hit_rate", "ttft_p50", "ttft_p99", "num_turns"):
        page.wait_for_selector(f'#overview [data-stat="{stat}"]', state="attached")
    page.wait_for_function(
        "(n) => { const el = document.querySelector('#overview [data-stat=num_turns]');"
        " return el && el.textContent.includes(String(n)); }",
        arg=overview["totals"]["num_turns"])
    assert first_number(page.text_content('#overview [data-stat="num_turns"]')) == \
        overview["totals"]["num_turns"]
    ui_report.screenshot(page, "overview_1280x800.png")
    assert_console_clean(ui)
