"""The browser side of the /ui tests: Debian's Chromium (installed with apt when missing),
driven by Playwright's sync API, and what the tests read back from the page.

Never `playwright install`: the browser is the system's `chromium`, passed as
`executable_path`. Every page records its console errors/warnings and page errors
(`ConsoleLog`); the tests fail on any that is not an expected network answer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

SYSTEM_CHROMIUM = "/usr/bin/chromium"
APT_TIMEOUT_S = 900
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def find_chromium() -> str | None:
    """The system Chromium: `chromium` on PATH, else /usr/bin/chromium; None when neither."""
    found = shutil.which("chromium")
    if found:
        return found
    return SYSTEM_CHROMIUM if os.access(SYSTEM_CHROMIUM, os.X_OK) else None


def apt_install_chromium() -> str | None:
    """`apt-get install -y --no-install-recommends chromium` (through `sudo -n` when not
    root; once more after `apt-get update` if the first try fails). Returns why it failed, or
    None when apt succeeded."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return "not root, and there is no sudo to run apt-get with"
        prefix = ["sudo", "-n", "env", "DEBIAN_FRONTEND=noninteractive"]
    if shutil.which("apt-get") is None:
        return "apt-get is not available (not a Debian-like system)"
    install = [*prefix, "apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    problem = ""
    for before in ([], [*prefix, "apt-get", "update"]):
        try:
            if before:
                subprocess.run(before, env=env, capture_output=True, text=True,
                               timeout=APT_TIMEOUT_S, check=False)
            done = subprocess.run(install, env=env, capture_output=True, text=True,
                                  timeout=APT_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"{' '.join(install)}: {exc}"
            continue
        if done.returncode == 0:
            return None
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        problem = f"{' '.join(install)} exited {done.returncode}: {' / '.join(tail)}"
    return problem


# A network answer the browser logs as a console error ("Failed to load resource: the server
# responded with a status of 404 (Not Found)"): expected where a test asks for a missing
# session or has no key yet.
def resource_status_error(status: int) -> re.Pattern[str]:
    return re.compile(rf"^Failed to load resource: the server responded with a status of "
                      rf"{status}\b")


@dataclass
class ConsoleLog:
    """Console messages of type error/warning and uncaught page errors of one page."""

    entries: list[str] = field(default_factory=list)

    def attach(self, page: Any) -> None:
        page.on("console", self._on_console)
        page.on("pageerror", self._on_page_error)

    def _on_console(self, message: Any) -> None:
        if message.type in ("error", "warning"):
            where = message.location or {}
            self.entries.append(f"console.{message.type}: {message.text} "
                                f"({where.get('url', '')}:{where.get('lineNumber', '')})")

    def _on_page_error(self, error: Any) -> None:
        self.entries.append(f"pageerror: {error}")

    def unexpected(self, *allowed: re.Pattern[str]) -> list[str]:
        """The entries no pattern of `allowed` matches (matched against the message text)."""
        out = []
        for entry in self.entries:
            text = entry.split(": ", 1)[1] if entry.startswith("console.") else entry
            if not any(p.search(text) for p in allowed):
                out.append(entry)
        return out


def first_number(text: str | None) -> float | None:
    """The first number in an element's text (None when it shows none)."""
    found = _NUMBER.search((text or "").replace("\u2212", "-"))
    return float(found.group()) if found else None


def squash(text: str | None) -> str:
    """Whitespace-normalized text."""
    return " ".join((text or "").split())


# Every drawn turn with its attributes and the text of its [data-field] elements; every edge;
# every branch-head label. One round trip.
READ_TREE_JS = """() => {
  const turns = [...document.querySelectorAll('#tree [data-turn-id]')].map(el => {
    const fields = {};
    for (const f of el.querySelectorAll('[data-field]')) {
      // The innermost turn element owns the field (a turn never nests another, but be sure).
      if (f.closest('[data-turn-id]') === el) fields[f.dataset.field] = f.textContent;
    }
    return {id: el.dataset.turnId, parent: el.hasAttribute('data-parent-id')
              ? el.dataset.parentId : null,
            role: el.dataset.role, seq: el.dataset.seq, fields,
            cacheBar: !!el.querySelector('.cache-bar')};
  });
  const edges = [...document.querySelectorAll('[data-edge-from][data-edge-to]')].map(
    el => [el.getAttribute('data-edge-from'), el.getAttribute('data-edge-to'),
           el instanceof SVGElement]);
  const heads = [...document.querySelectorAll('[data-head-branch][data-head-turn]')].map(
    el => [el.getAttribute('data-head-branch'), el.getAttribute('data-head-turn')]);
  return {turns, edges, heads};
}"""

# Records, from now on, every moment #live-text shows text for a generating turn: the page may
# show it for less time than a poll from here takes (the model is fast).
WATCH_LIVE_TEXT_JS = """() => {
  window.__liveSeen = [];
  const look = () => {
    const el = document.querySelector('#live-text[data-input-turn-id]');
    if (el && el.textContent.trim())
      window.__liveSeen.push([el.getAttribute('data-input-turn-id'), el.textContent]);
  };
  window.__liveObserver = new MutationObserver(look);
  window.__liveObserver.observe(document.documentElement,
    {subtree: true, childList: true, characterData: true, attributes: true});
  look();
}"""

# Scrolls every scrollable element of the tree view (and the window) to its bottom.
SCROLL_TO_BOTTOM_JS = """() => {
  const tree = document.querySelector('#tree');
  const boxes = [document.scrollingElement, tree, ...tree.querySelectorAll('*')];
  for (let el = tree.parentElement; el; el = el.parentElement) boxes.push(el);
  for (const el of boxes) {
    if (el && el.scrollHeight > el.clientHeight + 1) el.scrollTop = el.scrollHeight;
  }
  window.scrollTo(0, document.documentElement.scrollHeight);
}"""
