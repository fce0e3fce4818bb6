"""The OpenAI Codex CLI (`@openai/codex` from npm) for the tests, installed on first use.

Contract: `install_codex()` returns a `Codex` whose `codex` runs `codex --version` successfully,
at the pinned `CODEX_VERSION`, installed with npm under the same cache root as Claude Code
(`~/.cache/radixgate-tests/`, or `$XDG_CACHE_HOME/radixgate-tests/`) and reused by later runs.
It skips the calling test (`pytest.skip`, with the reason) when npm is not on PATH or the npm
registry does not answer; any other failure (a broken install, a binary that does not run)
raises, so it fails the test.

The `codex` on npm is a small Node wrapper (`bin/codex.js`, Node >= 16) around a native Rust
binary that lives in the optional per-platform dependency (`@openai/codex-linux-x64`, an alias of
`@openai/codex@<version>-linux-x64`, whose statically linked musl build needs no system
libraries). The install therefore keeps optional dependencies (`--include=optional`, and never
`--omit=optional`), or the wrapper finds no binary to run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.agents.claude_code_install import RegistryUnreachable, cache_dir

CODEX_VERSION = "0.171.0"  # the version these tests were written against
INSTALL_TIMEOUT_S = 600


@dataclass(frozen=True)
class Codex:
    codex: Path  # the `codex` executable (the npm wrapper in node_modules/.bin)

    def version(self) -> str:
        """What `codex --version` prints, e.g. `codex-cli 0.171.0`."""
        out = subprocess.run([str(self.codex), "--version"], capture_output=True, text=True,
                             timeout=60, check=True)
        return out.stdout.strip()


def _run_npm(npm: str, args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([npm, *args], capture_output=True, text=True, timeout=timeout)


def _registry_unreachable(npm: str) -> bool:
    try:
        return _run_npm(npm, ["ping"], timeout=60).returncode != 0
    except subprocess.TimeoutExpired:
        return True


def _install_into(target: Path, package: str, *, npm: str) -> None:
    """`npm install --prefix` (optional dependencies included) into a fresh folder, moved to
    `target` only once complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        args = ["install", "--prefix", str(staging), "--include=optional", "--no-audit",
                "--no-fund", "--loglevel=error", package]
        done = _run_npm(npm, args, timeout=INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            if _registry_unreachable(npm):
                raise RegistryUnreachable(f"npm install {package}: the registry is unreachable")
            raise RuntimeError(f"npm install {package} failed:\n{done.stdout}\n{done.stderr}")
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _runs(codex: Path, version: str) -> bool:
    """`codex --version` exits 0 and names `version`."""
    try:
        out = subprocess.run([str(codex), "--version"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and version in out.stdout


def install_codex(version: str = CODEX_VERSION) -> Codex:
    """Codex `version`, installed under the cache dir unless already there (and working).
    Skips the test when npm is missing or the registry is unreachable."""
    root = cache_dir() / f"codex-{version}"
    codex = root / "node_modules" / ".bin" / "codex"
    if not _runs(codex, version):
        npm = shutil.which("npm", path=os.environ.get("PATH", os.defpath))
        if npm is None:
            pytest.skip("Codex cannot be installed: npm is not on PATH")
        shutil.rmtree(root, ignore_errors=True)
        try:
            _install_into(root, f"@openai/codex@{version}", npm=npm)
        except RegistryUnreachable as exc:
            pytest.skip(f"Codex cannot be installed: {exc}")
        if not _runs(codex, version):
            raise RuntimeError(f"{codex} --version does not run (or is not {version}); is the "
                               "optional per-platform package @openai/codex-<os>-<arch> there?")
    return Codex(codex)
