"""`radixgate engine --port P`: an engine worker process behind a ZeroMQ ROUTER socket."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence

import zmq

from engine.engine import Engine
from engine.protocol import Message, decode, encode
from engine.worker import LoopHook, Origin, run_engine_loop

log = logging.getLogger(__name__)


def serve_engine(engine: Engine, host: str, port: int, hooks: Sequence[LoopHook] = ()) -> None:
    """Serve until SIGTERM/SIGINT (main thread only: installs signal handlers)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"radixgate engine: serving {engine.loaded.name} on tcp://{host}:{port}",
          file=sys.stderr, flush=True)
    serve_engine_socket(engine, host, port, stop, hooks)


def serve_engine_socket(engine: Engine, host: str, port: int, stop: threading.Event,
                        hooks: Sequence[LoopHook] = ()) -> None:
    """Serve until `stop` is set. Each client (DEALER) is addressed by its identity frame."""
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(f"tcp://{host}:{port}")
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)

    def receive(timeout_s: float) -> list[tuple[Origin, Message]]:
        items: list[tuple[Origin, Message]] = []
        while poller.poll(int(timeout_s * 1000) if not items else 0):
            identity, data = socket.recv_multipart()
            try:
                items.append((identity, decode(data)))
            except ValueError:
                log.warning("dropped a malformed message from %r", identity)
        return items

    def send(origin: Origin, message: Message) -> None:
        assert isinstance(origin, bytes)
        socket.send_multipart([origin, encode(message)])

    def should_stop() -> bool:
        # A tensor-parallel worker whose ranks failed cannot serve: it exits, to be restarted.
        return stop.is_set() or (engine.tp is not None and engine.tp.has_failed)

    try:
        run_engine_loop(engine, receive, send, should_stop, hooks)
    finally:
        socket.close()
        context.term()
