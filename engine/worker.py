"""The engine's serving loop, shared by the in-process thread and the ZeroMQ worker process.

Messages come in through `receive(timeout_s)` as (origin, message) pairs and results go out through
`send(origin, message)`; the loop never blocks while the engine has work.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

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
    Stats,
    StatsRequest,
    Unpin,
)

log = logging.getLogger(__name__)

Origin = Hashable
Receive = Callable[[float], list[tuple[Origin, Message]]]
Send = Callable[[Origin, Message], None]

IDLE_POLL_S = 0.05
HOOK_POLL_S = 0.005  # how often a hook with something pending (a KV transfer) is ticked


class LoopHook(Protocol):
    """Something more the loop serves (engine.disagg): it sees each message first, is ticked
    every turn of the loop, and sees every output."""

    @property
    def busy(self) -> bool:
        """Something is pending: the loop must not sleep long in receive."""
        ...

    def intercept(self, origin: Origin, message: Message,
                  send: Send) -> list[tuple[Origin, Message]] | None:
        """None: not this hook's, handle it as usual. Else the messages to handle instead
        (empty: the hook took it)."""
        ...

    def tick(self, send: Send) -> list[tuple[Origin, Message]]:
        """Messages the hook held back and releases now, to handle as usual."""
        ...

    def on_output(self, out: Message) -> None: ...

    def stats(self) -> dict[str, int]:
        """Counters to add to the engine's `Stats`."""
        ...


def run_engine_loop(engine: Engine, receive: Receive, send: Send,
                    should_stop: Callable[[], bool], hooks: Sequence[LoopHook] = ()) -> None:
    """Serve until `should_stop()`; a failing step fails its requests, never the worker."""
    origins: dict[str, Origin] = {}
    while not should_stop():
        timeout_s = (0.0 if engine.has_work
                     else HOOK_POLL_S if any(h.busy for h in hooks) else IDLE_POLL_S)
        incoming = receive(timeout_s)
        for hook in hooks:
            incoming = _intercepted(hook, incoming, send) + hook.tick(send)
        for origin, message in incoming:
            for reply_origin, reply in _handle(engine, origins, origin, message):
                if isinstance(reply, Stats):
                    reply = _with_hook_stats(reply, hooks)
                send(reply_origin, reply)
        if not engine.has_work:
            continue
        try:
            outputs = engine.step()
        except Exception as exc:  # noqa: BLE001 - a bug in one batch must not kill the worker
            log.exception("engine step failed; failing the requests in flight")
            outputs = engine.fail_all("engine_error", f"engine step failed: {exc!r}")
        for out in outputs:
            for hook in hooks:
                hook.on_output(out)
            request_id = getattr(out, "request_id", "")
            origin = origins.get(request_id)
            if isinstance(out, Finished | Failed):
                origins.pop(request_id, None)
            if origin is not None:
                send(origin, out)


def _intercepted(hook: LoopHook, incoming: list[tuple[Origin, Message]],
                 send: Send) -> list[tuple[Origin, Message]]:
    kept: list[tuple[Origin, Message]] = []
    for origin, message in incoming:
        instead = hook.intercept(origin, message, send)
        kept.extend([(origin, message)] if instead is None else instead)
    return kept


def _with_hook_stats(stats: Stats, hooks: Sequence[LoopHook]) -> Stats:
    counters: dict[str, int] = {}
    for hook in hooks:
        for name, value in hook.stats().items():
            counters[name] = counters.get(name, 0) + value
    return dataclasses.replace(stats, **counters) if counters else stats  # type: ignore[arg-type]


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
        num_new = (message.num_new_tokens if message.num_new_tokens >= 0
                   else len(message.token_ids) - cached_len)
        s = engine.scheduler
        return [(origin, PrefixMatch(message.request_id, cached_len, len(s.running),
                                     len(s.waiting), engine.worker_id,
                                     engine.queue_wait_s(
                                         num_new, reserve_for=message.reserve_for,
                                         max_wait_s=message.max_wait_s)))]
    return []


class EngineThread:
    """Runs an engine loop in a daemon thread of this process (tests, `generate`)."""

    def __init__(self, engine: Engine, send: Send, hooks: Sequence[LoopHook] = ()) -> None:
        self.engine = engine
        self._inbox: queue.Queue[tuple[Origin, Message]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=run_engine_loop, args=(engine, self._receive, send, self._stop.is_set, hooks),
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
