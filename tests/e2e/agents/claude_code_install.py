"""Claude Code (`@anthropic-ai/claude-code` from npm) for the tests, installed on first use.

It needs Node >= 22. When the `node` on PATH is older (or missing), Node 22 is installed from the
npm registry itself (the `node-<os>-<arch>` packages carry the official binary), so nothing but
the registry has to be reachable; `npm install` does it when npm is on PATH, else the package's
tarball is fetched from the registry directly (and so is npm 10, to install Claude Code with).
Everything lands under `~/.cache/radixgate-tests/` (or `$XDG_CACHE_HOME/radixgate-tests/`) and
is reused by later runs.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CLAUDE_CODE_VERSION = "2.1.332"  # the version these tests were written against
NODE_MAJOR = 22
INSTALL_TIMEOUT_S = 600


class RegistryUnreachable(RuntimeError):
    """The npm registry did not answer (the only reason the Claude Code test skips)."""


@dataclass(frozen=True)
class ClaudeCode:
    claude: Path  # the `claude` executable
    path: str  # a PATH with a Node >= 22 first

    def version(self) -> str:
        out = subprocess.run([str(self.claude), "--version"], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PATH": self.path})
        return out.stdout.strip()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "radixgate-tests"


def _node_major(node: str | None) -> int:
    if node is None:
        return 0
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return 0
    match = re.match(r"v(\d+)\.", out.stdout.strip())
    return int(match.group(1)) if match else 0


def _npm_command(path: str) -> list[str]:
    """npm on PATH (run by the first `node` on `path`), else npm 10 from the registry."""
    npm = shutil.which("npm", path=path)
    if npm is not None:
        return [npm]
    node = shutil.which("node", path=path)
    if node is None:
        raise RuntimeError("no node on PATH to run npm with")
    package = _unpack_from_registry("npm", 10, cache_dir() / "npm-10")
    return [node, str(package / "bin" / "npm-cli.js")]


def _npm(args: list[str], *, path: str, cwd: Path | None = None) -> None:
    done = subprocess.run([*_npm_command(path), *args, "--no-audit", "--no-fund",
                           "--loglevel=error"],
                          cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                          env={**os.environ, "PATH": path})
    if done.returncode != 0:
        if _registry_unreachable(path):
            raise RegistryUnreachable(f"npm {' '.join(args)}: the registry is unreachable")
        raise RuntimeError(f"npm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


def _registry_unreachable(path: str) -> bool:
    try:
        ping = subprocess.run([*_npm_command(path), "ping"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PATH": path})
    except subprocess.TimeoutExpired:
        return True
    return ping.returncode != 0


def registry_url() -> str:
    """The registry npm uses ($npm_config_registry, `npm config get registry`), else npmjs."""
    url = os.environ.get("npm_config_registry") or os.environ.get("NPM_CONFIG_REGISTRY")
    npm = shutil.which("npm")
    if not url and npm is not None:
        try:
            url = subprocess.run([npm, "config", "get", "registry"], capture_output=True,
                                 text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            url = None
    return (url or "https://registry.npmjs.org/").rstrip("/") + "/"


def _fetch(url: str, *, accept: str | None = None, timeout: float = 60) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data: bytes = response.read()
            return data
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise RegistryUnreachable(f"{url}: {exc}") from exc
        raise RuntimeError(f"{url}: {exc}") from exc  # the registry answered
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise RegistryUnreachable(f"{url}: {exc}") from exc


def _semver(version: str) -> tuple[int, int, int] | None:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def _unpack_from_registry(name: str, major: int, target: Path) -> Path:
    """The newest `name@major` release's tarball, checked against its sha512 integrity, its
    `package/` dir unpacked as `target` (moved there only once complete); returns `target`."""
    if (target / "package.json").is_file():
        return target
    meta = json.loads(_fetch(registry_url() + name,
                             accept="application/vnd.npm.install-v1+json"))
    releases = {v: parsed for v in meta["versions"]
                if (parsed := _semver(v)) is not None and parsed[0] == major}
    if not releases:
        raise RuntimeError(f"the registry has no {name}@{major}")
    dist = meta["versions"][max(releases, key=lambda v: releases[v])]["dist"]
    blob = _fetch(dist["tarball"], timeout=INSTALL_TIMEOUT_S)
    integrity = str(dist.get("integrity", ""))
    if integrity.startswith("sha512-") and integrity.removeprefix("sha512-") != \
            base64.b64encode(hashlib.sha512(blob).digest()).decode():
        raise RuntimeError(f"{dist['tarball']}: integrity mismatch")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            tar.extractall(staging, filter="tar")
        shutil.rmtree(target, ignore_errors=True)
        (staging / "package").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _install_into(target: Path, package: str, *, path: str) -> None:
    """`npm install --prefix` into a fresh folder, moved to `target` only once complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        _npm(["install", "--prefix", str(staging), package], path=path)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _node_package() -> str:
    system = {"linux": "linux", "darwin": "darwin"}.get(sys.platform)
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower())
    if system is None or arch is None:
        raise RuntimeError(f"no npm package of Node for {sys.platform}/{platform.machine()}")
    return f"node-{system}-{arch}@{NODE_MAJOR}"


def node_path() -> str:
    """A PATH whose first `node` is >= 22: the system's when it is, else one from npm."""
    path = os.environ.get("PATH", os.defpath)
    if _node_major(shutil.which("node", path=path)) >= NODE_MAJOR:
        return path
    package = _node_package()
    root = cache_dir() / package.replace("@", "-")
    name = package.rsplit("@", 1)[0]
    bin_dir = root / "node_modules" / name / "bin"
    if _node_major(str(bin_dir / "node")) < NODE_MAJOR:
        shutil.rmtree(root, ignore_errors=True)
        if shutil.which("npm", path=path) is not None:
            _install_into(root, package, path=path)
        else:  # no npm yet: the package's tarball straight from the registry
            _unpack_from_registry(name, NODE_MAJOR, root / "node_modules" / name)
            (bin_dir / "node").chmod(0o755)
    if _node_major(str(bin_dir / "node")) < NODE_MAJOR:
        raise RuntimeError(f"{bin_dir / 'node'} is not a working Node >= {NODE_MAJOR}")
    return f"{bin_dir}{os.pathsep}{path}"


def install_claude_code(version: str = CLAUDE_CODE_VERSION) -> ClaudeCode:
    """Claude Code `version`, installed under the cache dir unless already there. Raises
    RegistryUnreachable when it has to be fetched and the npm registry does not answer."""
    path = node_path()
    root = cache_dir() / f"claude-code-{version}"
    claude = root / "node_modules" / ".bin" / "claude"
    if not claude.exists():
        shutil.rmtree(root, ignore_errors=True)
        _install_into(root, f"@anthropic-ai/claude-code@{version}", path=path)
    return ClaudeCode(claude, path)
