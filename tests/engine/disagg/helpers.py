"""Two engine workers in threads of this process, each behind its real ZeroMQ socket: a prefill
worker and a decode worker that pulls long deltas' KV from it over a gloo pair."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from engine.disagg.decode_side import KvPuller
from engine.disagg.prefill_side import KvServer
from engine.engine import Engine
from engine.server import serve_engine_socket
from engine.worker import LoopHook


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Served:
    engine: Engine
    address: str
    stop: threading.Event
    thread: threading.Thread

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the worker loop did not stop"


def serve_in_thread(engine: Engine, hooks: Sequence[LoopHook]) -> Served:
    port = free_port()
    stop = threading.Event()
    thread = threading.Thread(target=serve_engine_socket,
                              args=(engine, "127.0.0.1", port, stop, hooks), daemon=True)
    thread.start()
    return Served(engine, f"tcp://127.0.0.1:{port}", stop, thread)


def wait_until(predicate: object, timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


@contextmanager
def disagg_pair(prefill: Engine, decode: Engine, min_tokens: int, deadline_s: float = 60.0
                ) -> Iterator[tuple[Served, Served, KvServer, KvPuller]]:
    """Serve both; yields once the decode worker's pair with the prefill worker is formed."""
    server = KvServer(prefill, "127.0.0.1")
    prefill_served = serve_in_thread(prefill, [server])
    puller = KvPuller(decode, [prefill_served.address], min_tokens=min_tokens,
                      deadline_s=deadline_s)
    decode_served = serve_in_thread(decode, [KvServer(decode, "127.0.0.1"), puller])
    try:
        wait_until(lambda: puller.stats()["num_kv_peers"] == 1, what="the KV pair")
        yield prefill_served, decode_served, server, puller
    finally:
        decode_served.close()
        if prefill_served.thread.is_alive():
            prefill_served.close()
        puller.close()
