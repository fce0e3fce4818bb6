"""/ui with API keys: the page asks for a key (after a 401), then lists only that tenant's
sessions, and another tenant's session is "not found". Its own live server: once a key is
stored, open access ends for every client of that server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import sdk
from tests.e2e.agents.live_serve import LiveServer
from tests.ui.browser import resource_status_error
from tests.ui.conftest import OpenPage, UiReport


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("ui-keys-serve")) as server:
        yield server


def create_key(server: LiveServer, tenant: str) -> str:
    """`radixgate keys create --tenant T` against the running server's store."""
    done = server.process.radixgate("keys", "create", "--tenant", tenant,
                                    "--state-dir", str(server.process.state_dir))
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip().splitlines()[0]
    assert key.startswith("rg-"), done.stdout
    return key


def create_sessions(server: LiveServer, key: str, tenant: str, n: int) -> list[str]:
    """`n` sessions of the key's tenant, oldest first (no generation: the model is not needed)."""
    with sdk.Client(server.url, key) as client:
        return [client.sessions.create(system=f"Session {i} of {tenant}.",
                                       metadata={"owner": tenant, "n": i}).id
                for i in range(n)]


def listed_ids(page: Any) -> list[str]:
    ids: list[str] = page.eval_on_selector_all("#sessions [data-session-id]",
                                               "els => els.map(e => e.dataset.sessionId)")
    return ids


def test_key_form_then_only_the_tenants_sessions(keyed_server: LiveServer,
                                                 open_page: OpenPage,
                                                 ui_report: UiReport) -> None:
    key_a, key_b = create_key(keyed_server, "alpha"), create_key(keyed_server, "beta")
    sessions_a = create_sessions(keyed_server, key_a, "alpha", 2)
    (session_b,) = create_sessions(keyed_server, key_b, "beta", 1)
    assert keyed_server.http.get("/v1/sessions").status_code == 401  # keys are enforced now

    ui = open_page(keyed_server.url)
    page = ui.page
    ui.open("/")
    form = page.locator("#key-form")
    form.wait_for(state="visible")
    ui_report.screenshot(page, "key_form_1280x800.png")
    page.fill("#key-form input[name=api-key]", key_a)
    page.locator("#key-form button").first.click()
    page.wait_for_function(
        "(n) => document.querySelectorAll('#sessions [data-session-id]').length >= n",
        arg=len(sessions_a))
    page.wait_for_timeout(300)  # nothing more arrives
    assert listed_ids(page) == sessions_a[::-1], "newest first, tenant alpha's only"
    assert session_b not in listed_ids(page)
    assert not form.is_visible(), "#key-form still shown after a good key"
    assert page.evaluate("() => localStorage.getItem('radixgate.key')") == key_a

    ui.route(f"/s/{sessions_a[0]}")
    page.wait_for_selector(f'#tree[data-session-id="{sessions_a[0]}"][data-ready="1"]',
                           state="attached")
    ui.route(f"/s/{session_b}")  # beta's session, seen with alpha's key
    not_found = page.locator("#not-found")
    not_found.wait_for(state="visible")
    assert "not found" in (not_found.text_content() or "").lower()
    assert not page.locator(f'#tree[data-session-id="{session_b}"] [data-turn-id]').count()

    # The key is remembered: a new load of the page needs no form.
    ui.open("/")
    page.wait_for_selector(f'#sessions [data-session-id="{sessions_a[0]}"]')
    assert not form.is_visible()
    unexpected = ui.console.unexpected(resource_status_error(401), resource_status_error(404))
    assert not unexpected, unexpected
