"""The engine's serving loop, shared by the in-process thread and the ZeroMQ worker process.

Messages come in through `receive(timeout_s)` as (origin, message) pairs and results go out through
`send(origin, message)`; the loop never blocks while the engine has work.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Hashable

from engine.engine import Engine
from engine.protocol import (
    Abort,
    Extend,
    Failed,
    Finished,
    Message,
    Pin,
    PrefixMatch,
    PrefixProbe,
    StatsRequest,
    Unpin,
)

log = logging.getLogger(__name__)

Origin = Hashable
Receive = Callable[[float], list[tuple[Origin, Message]]]
Send = Callable[[Origin, Message], None]

IDLE_POLL_S = 0.05


def run_engine_loop(engine: Engine, receive: Receive, send: Send,
                    should_stop: Callable[[], bool]) -> None:
    """Serve until `should_stop()`; a failing step fails its requests, never the worker."""
    origins: dict[str, Origin] = {}
    while not should_stop():
        for origin, message in receive(0.0 if engine.has_work else IDLE_POLL_S):
            for reply_origin, reply in _handle(engine, origins, origin, message):
                send(reply_origin, reply)
        if not engine.has_work:
            continue
        try:
            outputs = engine.step()
        except Exception as exc:  # noqa: BLE001 - a bug in one batch must not kill the worker
            log.exception("engine step failed; failing the requests in flight")
            outputs = engine.fail_all("engine_error", f"engine step failed: {exc!r}")
        for out in outputs:
            request_id = getattr(out, "request_id", "")
            origin = origins.get(request_id)
            if isinstance(out, Finished | Failed):
                origins.pop(request_id, None)
            if origin is not None:
                send(origin, out)


def _handle(engine: Engine, origins: dict[str, Origin], origin: Origin,
            message: Message) -> list[tuple[Origin, Message]]:
    if isinstance(message, Extend):
        failed = engine.submit(message)
        if failed:
            return [(origin, m) for m in failed]
        origins[message.request_id] = origin
        return []
    if isinstance(message, Abort):
        out = engine.abort(message.request_id)
        target = origins.pop(message.request_id, origin)
        return [(target, m) for m in out]
    if isinstance(message, Pin):
        engine.pin(message.turn_id, message.ttl_s)
    elif isinstance(message, Unpin):
        engine.unpin(message.turn_id)
    elif isinstance(message, StatsRequest):
        return [(origin, engine.stats(message.request_id))]
    elif isinstance(message, PrefixProbe):
        cached_len = engine.cache.cached_prefix_len(message.namespace, message.token_ids)
        s = engine.scheduler
        return [(origin, PrefixMatch(message.request_id, cached_len, len(s.running),
                                     len(s.waiting), engine.worker_id))]
    return []


class EngineThread:
    """Runs an engine loop in a daemon thread of this process (tests, `generate`)."""

    def __init__(self, engine: Engine, send: Send) -> None:
        self.engine = engine
        self._inbox: queue.Queue[tuple[Origin, Message]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=run_engine_loop, args=(engine, self._receive, send, self._stop.is_set),
            name="radixgate-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, origin: Origin, message: Message) -> None:
        self._inbox.put((origin, message))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _receive(self, timeout_s: float) -> list[tuple[Origin, Message]]:
        items: list[tuple[Origin, Message]] = []
        try:
            items.append(self._inbox.get(timeout=timeout_s) if timeout_s > 0
                         else self._inbox.get_nowait())
        except queue.Empty:
            return items
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items
