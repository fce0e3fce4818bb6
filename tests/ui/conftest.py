"""Fixtures of the /ui browser tests: the system Chromium (apt-installed when missing) under
Playwright, one live `radixgate serve` for the package, a fresh browser context per page, and
the folder the screenshots go to (printed at the end of the run)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agents.live_serve import LiveServer
from tests.ui.browser import ConsoleLog, apt_install_chromium, find_chromium

REPO = Path(__file__).resolve().parents[2]
SHOTS_DIR = REPO / "bench-results" / "ui"  # gitignored (bench-results/)
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
DEFAULT_TIMEOUT_MS = 20_000


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    """Debian's Chromium; installed with apt-get when missing, else the tests are skipped."""
    path = find_chromium()
    if path is None:
        problem = apt_install_chromium()
        path = find_chromium()
        if path is None:
            pytest.skip(f"no system Chromium and apt could not install it: {problem}")
    return path


@pytest.fixture(scope="session")
def browser(chromium_executable: str) -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the /ui tests need the `playwright` package (dev extra)")
    playwright = sync_api.sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=chromium_executable,
                                              headless=True)
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        playwright.stop()


@pytest.fixture(scope="package")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real `serve` (embedded model and Valkey, open access) shared by the package's tests
    that do not need keys."""
    with LiveServer(tmp_path_factory.mktemp("ui-serve")) as server:
        yield server


class UiReport:
    """Where the screenshots went and the timings measured, printed after the run and written
    to `timings.json` next to the screenshots."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: list[str] = []
        self.timings: dict[str, Any] = {}

    def screenshot(self, page: Any, name: str, **options: Any) -> Path:
        path = self.folder / name
        page.screenshot(path=str(path), **options)
        self.files.append(name)
        return path


REPORTS = pytest.StashKey[list[UiReport]]()  # the run's reports, on its config


@pytest.fixture(scope="session")
def ui_report(pytestconfig: pytest.Config) -> Iterator[UiReport]:
    SHOTS_DIR.mkdir(parents=True, exist_ok=True)
    report = UiReport(SHOTS_DIR)
    pytestconfig.stash.setdefault(REPORTS, []).append(report)
    yield report
    if report.timings:
        (SHOTS_DIR / "timings.json").write_text(json.dumps(report.timings, indent=2) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Where the screenshots are, and the timings measured (after the run, not captured)."""
    for report in terminalreporter.config.stash.get(REPORTS, []):
        terminalreporter.write_line(f"tests/ui: screenshots in {report.folder}: "
                                    f"{', '.join(sorted(report.files)) or '-'}")
        for name, value in report.timings.items():
            terminalreporter.write_line(f"tests/ui: {name} = {value}")


@dataclass
class UiPage:
    """One page in its own browser context (its own localStorage), with its console log."""

    page: Any
    console: ConsoleLog
    base_url: str

    def open(self, route: str = "") -> None:
        """Load /ui with the hash `route` (e.g. "/s/<id>"): a full load, not a hash change."""
        self.page.goto(f"{self.base_url}/ui#{route}" if route else f"{self.base_url}/ui")

    def route(self, route: str) -> None:
        """Go to `route` inside the loaded page (a hash change, as a click on a link does)."""
        self.page.evaluate("(r) => { location.hash = r; }", route)


OpenPage = Callable[..., UiPage]


@pytest.fixture
def open_page(browser: Any) -> Iterator[OpenPage]:
    """`open_page(base_url, viewport=DESKTOP)`: a new context and page; closed after the test.
    Every dialog (confirm/prompt) is accepted."""
    contexts: list[Any] = []

    def make(base_url: str, viewport: dict[str, int] | None = None) -> UiPage:
        context = browser.new_context(viewport=viewport or DESKTOP)
        context.set_default_timeout(DEFAULT_TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        console = ConsoleLog()
        console.attach(page)
        page.on("dialog", lambda dialog: dialog.accept())
        return UiPage(page, console, base_url)

    yield make
    for context in contexts:
        context.close()
