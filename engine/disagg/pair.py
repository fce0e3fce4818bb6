"""One two-rank gloo group between a prefill worker (rank 0) and a decode worker (rank 1).

Transfers go one way, prefill to decode, in the order the decode worker asked for them: each is
a header `int64[3] = (tag, num_pages, ok)` and, when ok and num_pages > 0, one payload tensor
`(num_pages, 2 * num_layers, *page_shape)` (K of every layer, then V). gloo's `Work` completes
only inside `wait()`, so each side waits in its own thread and never in the engine loop.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._C import _distributed_c10d as c10d  # torch.distributed re-exports these untyped

log = logging.getLogger(__name__)

PREFILL_RANK = 0
DECODE_RANK = 1


@dataclass(frozen=True)
class PayloadSpec:
    """What a payload of n pages looks like: (n, 2 * num_layers, *page_shape) of `dtype`."""

    num_layers: int
    page_shape: tuple[int, ...]
    dtype: torch.dtype

    def empty(self, num_pages: int) -> torch.Tensor:
        return torch.empty((num_pages, 2 * self.num_layers, *self.page_shape), dtype=self.dtype)


def open_group(store: c10d.Store, key: str, rank: int, host: str,
               timeout_s: float) -> c10d.ProcessGroupGloo:
    """Join the pair's group (blocks until the other rank joins or `timeout_s`). `host`: this
    side's address as the other side reaches it."""
    options = c10d.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = datetime.timedelta(seconds=timeout_s)
    options._devices = [c10d.ProcessGroupGloo.create_device(hostname=host)]
    return c10d.ProcessGroupGloo(c10d.PrefixStore(key, store), rank, 2, options)


class Pair:
    """A pair's group, joined in a background thread; `broken` once any op on it failed (a
    broken pair is never used again: the decode worker opens a new one under a new key)."""

    def __init__(self, join: Callable[[], c10d.ProcessGroupGloo], name: str) -> None:
        self.name = name
        self.group: c10d.ProcessGroupGloo | None = None
        self.broken = False
        self._joined = threading.Event()
        threading.Thread(target=self._join, args=(join,), name=f"kv-join-{name}",
                         daemon=True).start()

    @property
    def ready(self) -> bool:
        return self.group is not None and not self.broken

    def wait_joined(self, timeout_s: float) -> bool:
        return self._joined.wait(timeout_s) and self.ready

    def _join(self, join: Callable[[], c10d.ProcessGroupGloo]) -> None:
        try:
            self.group = join()
        except Exception as exc:  # noqa: BLE001 - the peer never came: this pair is unusable
            log.warning("KV pair %s did not form: %s", self.name, exc)
            self.broken = True
        self._joined.set()


class Sender:
    """Rank 0's FIFO of transfers. `on_done(tag, num_pages, ok)` runs in the sender thread."""

    def __init__(self, pair: Pair, on_done: Callable[[int, int, bool], None]) -> None:
        self.pair = pair
        self._queue: queue.Queue[tuple[int, torch.Tensor | None]] = queue.Queue()
        self._on_done = on_done
        threading.Thread(target=self._run, name=f"kv-send-{pair.name}", daemon=True).start()

    def put(self, tag: int, payload: torch.Tensor | None) -> None:
        """Send `payload` (None: tell the decode worker this transfer failed)."""
        self._queue.put((tag, payload))

    def _run(self) -> None:
        while True:
            tag, payload = self._queue.get()
            num_pages = 0 if payload is None else payload.shape[0]
            ok = False
            if self.pair.wait_joined(timeout_s=600.0):
                try:
                    group: Any = self.pair.group  # send/recv are untyped on Backend
                    assert group is not None
                    header = torch.tensor([tag, num_pages, int(payload is not None)],
                                          dtype=torch.int64)
                    group.send([header], DECODE_RANK, 2 * tag).wait()
                    if payload is not None and num_pages:
                        group.send([payload.contiguous()], DECODE_RANK, 2 * tag + 1).wait()
                    ok = payload is not None
                except Exception as exc:  # noqa: BLE001 - the decode worker died or hung up
                    log.warning("KV transfer %d on %s failed: %s", tag, self.pair.name, exc)
                    self.pair.broken = True
            self._on_done(tag, num_pages, ok)


class Receiver:
    """Rank 1's FIFO of expected transfers; each result goes to `on_done(tag, payload | None)`."""

    def __init__(self, pair: Pair, spec: PayloadSpec,
                 on_done: Callable[[int, torch.Tensor | None], None]) -> None:
        self.pair = pair
        self.spec = spec
        self._queue: queue.Queue[int] = queue.Queue()
        self._on_done = on_done
        threading.Thread(target=self._run, name=f"kv-recv-{pair.name}", daemon=True).start()

    def expect(self, tag: int) -> None:
        self._queue.put(tag)

    def _run(self) -> None:
        while True:
            tag = self._queue.get()
            payload = None
            if self.pair.ready:
                try:
                    payload = self._receive(tag)
                except Exception as exc:  # noqa: BLE001 - the prefill worker died or hung up
                    log.warning("KV transfer %d on %s failed: %s", tag, self.pair.name, exc)
                    self.pair.broken = True
            self._on_done(tag, payload)

    def _receive(self, tag: int) -> torch.Tensor | None:
        group: Any = self.pair.group  # send/recv are untyped on Backend
        assert group is not None
        header = torch.empty(3, dtype=torch.int64)
        group.recv([header], PREFILL_RANK, 2 * tag).wait()
        sent_tag, num_pages, ok = (int(x) for x in header.tolist())
        if sent_tag != tag:
            raise RuntimeError(f"expected transfer {tag}, got {sent_tag}")
        if not ok or num_pages == 0:
            return None
        payload = self.spec.empty(num_pages)
        group.recv([payload], PREFILL_RANK, 2 * tag + 1).wait()
        return payload
