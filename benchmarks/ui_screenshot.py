"""The README's picture of the session-tree page: a real `radixgate serve`, a real run of
`examples/coding_agent.py` against it, then `/ui` on that session in Debian's Chromium.

    .venv/bin/python -m benchmarks.ui_screenshot [--out docs/img/coding_agent_tree.png]

Needs the system Chromium (`apt-get install chromium`) and the `playwright` package (dev
extra); never `playwright install`. Also writes the phone-width picture next to it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.serve_process import ServeProcess

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
VIEWPORTS = {"": (1280, 800), "_phone": (390, 844)}


def run_example(url: str) -> str:
    """Run the example as a user does; returns the session id it printed."""
    print("running examples/coding_agent.py ...", flush=True)
    done = subprocess.run([sys.executable, str(REPO / "examples" / "coding_agent.py"),
                           "--base-url", url], capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"the example failed:\n{done.stderr[-3000:]}")
    print(done.stdout)
    found = re.search(r"^session ([0-9a-f]+)$", done.stdout, re.M)
    if found is None:
        raise SystemExit("the example printed no session id")
    return found.group(1)


def screenshot(url: str, session_id: str, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright  # dev extra

    chromium = shutil.which("chromium") or CHROMIUM
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        try:
            for suffix, (width, height) in VIEWPORTS.items():
                page = browser.new_page(viewport={"width": width, "height": height})
                page.goto(f"{url}/ui#/s/{session_id}")
                page.wait_for_selector('#tree[data-ready="1"]')
                rows = page.locator('[data-turn-id][data-role="assistant"]')
                rows.nth(rows.count() - 3).click()  # a tool-calling turn near the end
                page.wait_for_selector("#turn-detail[data-turn-id]")
                path = out.with_name(out.stem + suffix + out.suffix)
                page.screenshot(path=str(path))
                written.append(path)
                page.close()
        finally:
            browser.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img" /
                        "coding_agent_tree.png")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rg-ui-shot-") as state:
        print("starting radixgate serve (model load) ...", flush=True)
        server = ServeProcess.start(Path(state), "--threads", "1")
        try:
            session_id = run_example(server.url)
            for path in screenshot(server.url, session_id, args.out):
                print(f"wrote {path}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
