"""`radixgate serve` as a real process for end-to-end tests and benchmarks: its own state dir
(embedded Valkey), stderr kept in a file, readiness from /readyz, its children's pids from
serve.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.worker import free_port

READY_TIMEOUT_S = 180.0


def _clean_env() -> dict[str, str]:
    """This environment without RADIXGATE_ settings (the embedded store, no stray key), but
    the model one ($RADIXGATE_MODEL: the test suite's fast model, a benchmark's choice)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("RADIXGATE_") or k == "RADIXGATE_MODEL"}


class ServeProcess:
    """Start with `ServeProcess.start(state_dir, *flags)`; `stop()` always, in a `finally`."""

    def __init__(self, state_dir: Path, port: int, process: subprocess.Popen[bytes],
                 log_path: Path) -> None:
        self.state_dir = state_dir
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process = process
        self.log_path = log_path
        self.http = httpx.Client(base_url=self.url, timeout=300)

    @classmethod
    def start(cls, state_dir: Path, *flags: str, env: dict[str, str] | None = None,
              kv_memory_mib: int = 256) -> ServeProcess:
        port = free_port()
        log_path = state_dir / f"serve-{port}.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        base_env = _clean_env()
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port),
                 "--state-dir", str(state_dir), "--kv-memory", str(kv_memory_mib), *flags],
                env={**base_env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
        server = cls(state_dir, port, process, log_path)
        try:
            server.wait_ready()
        except BaseException:
            server.stop(signal.SIGKILL)
            raise
        return server

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pids(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "serve.json").read_text())
        return data

    def ready(self) -> tuple[int, dict[str, Any]]:
        r = self.http.get("/readyz", timeout=10)
        return r.status_code, dict(r.json())

    def wait_ready(self, *, timeout_s: float = READY_TIMEOUT_S,
                   until: str | None = None, value: object = None) -> dict[str, Any]:
        """Wait for /readyz 200 (and, with `until`, for that field to equal `value`)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited ({self.process.returncode}):\n{self.log}")
            try:
                status, body = self.ready()
                if status == 200 and (until is None or body.get(until) == value):
                    return body
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"serve did not become ready:\n{self.log[-4000:]}")

    def radixgate(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run another `radixgate` command against this server's state dir."""
        env = _clean_env()
        return subprocess.run([sys.executable, "-m", "gateway.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Signal serve and wait for it; returns its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.http.close()
        return self.process.returncode


def is_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still alive after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(map(is_alive, pids)):
        time.sleep(0.1)
    return [pid for pid in pids if is_alive(pid)]
