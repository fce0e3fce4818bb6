"""The prefill worker's side of disaggregation: pairs with decode workers, prefills what they
ask for over its own radix cache, and sends the pages.

A `PrefillFor` becomes an internal request (`kv:<decode key>:<tag>`, one greedy token, its
output discarded). When it finishes, the prompt's pages are in this worker's cache; pages
`first_page..` are copied out (so nothing stays locked while the bytes cross) and queued on the
pair's sender. A request that fails, or pages evicted before the copy, send a failure header:
the decode worker recomputes.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass

import torch
from torch._C import _distributed_c10d as c10d

from engine.cache.disk_tier import DiskTier
from engine.disagg.pair import PREFILL_RANK, Pair, Sender, open_group
from engine.engine import Engine
from engine.protocol import (
    Extend,
    Failed,
    Finished,
    KvAccept,
    KvConnect,
    Message,
    PrefillFor,
)
from engine.sampling_params import SamplingParams
from engine.worker import Origin, Send

log = logging.getLogger(__name__)

REQUEST_PREFIX = "kv:"


def kv_fingerprint(engine: Engine) -> str:
    return DiskTier.fingerprint(engine.loaded.name, engine.loaded.tokenizer.vocab_hash,
                                engine.kv_pool)


def gather_pages(engine: Engine, page_ids: list[int]) -> torch.Tensor:
    """(len(page_ids), 2 * num_layers, *page_shape): K of every layer, then V (a copy)."""
    index = torch.tensor(page_ids, dtype=torch.long, device=engine.kv_pool.k[0].device)
    layers = [k.index_select(0, index) for k in engine.kv_pool.k]
    layers += [v.index_select(0, index) for v in engine.kv_pool.v]
    return torch.stack(layers, dim=1).cpu()


@dataclass(frozen=True)
class _Job:
    request: PrefillFor


class KvServer:
    """A `LoopHook` every worker runs: any worker can prefill for a decode worker that asks."""

    def __init__(self, engine: Engine, host: str, group_timeout_s: float = 300.0) -> None:
        self.engine = engine
        self.host = socket.gethostbyname(socket.gethostname()) if host in ("0.0.0.0", "") \
            else host
        self.group_timeout_s = group_timeout_s
        self._store: c10d.TCPStore | None = None
        self._senders: dict[str, Sender] = {}
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()  # guards the counters the sender threads update
        self.num_sending = 0  # transfers queued or crossing now
        self.num_sent_pages = 0
        self.num_failed = 0

    @property
    def busy(self) -> bool:
        return False

    @property
    def num_ready_pairs(self) -> int:
        return sum(sender.pair.ready for sender in self._senders.values())

    @property
    def num_prefilling(self) -> int:
        """Transfers whose KV is being computed (not yet queued to send)."""
        return len(self._jobs)

    def stats(self) -> dict[str, int]:
        return {"num_kv_sent_pages": self.num_sent_pages,
                "num_kv_failed_transfers": self.num_failed}

    def intercept(self, origin: Origin, message: Message,
                  send: Send) -> list[tuple[Origin, Message]] | None:
        if isinstance(message, KvConnect):
            send(origin, self._connect(message))
            return []
        if isinstance(message, PrefillFor):
            self._prefill(message)
            return []
        return None

    def tick(self, send: Send) -> list[tuple[Origin, Message]]:
        return []

    def on_output(self, out: Message) -> None:
        request_id = getattr(out, "request_id", "")
        if not request_id.startswith(REQUEST_PREFIX) or not isinstance(out, Finished | Failed):
            return
        job = self._jobs.pop(request_id, None)
        if job is None:
            return
        payload = self._pages_of(job.request) if isinstance(out, Finished) else None
        self._send(job.request, payload)

    # ----- internals -----

    def _connect(self, message: KvConnect) -> KvAccept:
        if not self.engine.config.enable_prefix_cache:
            return KvAccept(message.decode_key, "", 0, "this worker runs with --no-prefix-cache")
        if self.engine.swa is not None:
            # Transfers move whole pages of every layer; the sliding group has other page ids.
            return KvAccept(message.decode_key, "", 0, "this worker keeps sliding-window KV in "
                            "its own pages (run it with --no-swa-memory to prefill for others)")
        if message.fingerprint != kv_fingerprint(self.engine):
            return KvAccept(message.decode_key, "", 0,
                            "another model, KV dtype or page size than this worker's")
        if self._store is None:
            self._store = c10d.TCPStore(self.host, 0, is_master=True, wait_for_workers=False)
        store, key, timeout_s = self._store, message.decode_key, self.group_timeout_s
        pair = Pair(lambda: open_group(store, key, PREFILL_RANK, self.host, timeout_s), key)
        self._senders[key] = Sender(pair, self._on_sent)
        return KvAccept(key, self.host, self._store.port)

    def _prefill(self, message: PrefillFor) -> None:
        sender = self._senders.get(message.decode_key)
        if sender is None or sender.pair.broken:
            log.warning("PrefillFor on unknown or broken pair %s", message.decode_key)
            return  # the decode worker's receive fails on the broken pair and it recomputes
        request_id = f"{REQUEST_PREFIX}{message.decode_key}:{message.tag}"
        with self._lock:
            self.num_sending += 1
        failed = self.engine.submit(Extend(
            request_id, message.namespace, None, list(message.token_ids),
            SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)))
        if failed:
            self._send(message, None)
        else:
            self._jobs[request_id] = _Job(message)

    def _pages_of(self, message: PrefillFor) -> torch.Tensor | None:
        num_pages = len(message.token_ids) // self.engine.kv_pool.layout.page_size
        match = self.engine.cache.match_prefix(message.namespace, message.token_ids)
        if len(match.page_ids) < num_pages:
            return None  # evicted already (the pool is too small for the load)
        return gather_pages(self.engine, list(match.page_ids[message.first_page:num_pages]))

    def _send(self, message: PrefillFor, payload: torch.Tensor | None) -> None:
        sender = self._senders.get(message.decode_key)
        if sender is None:
            self._on_sent(message.tag, 0, False)
            return
        sender.put(message.tag, payload)

    def _on_sent(self, tag: int, num_pages: int, ok: bool) -> None:
        with self._lock:
            self.num_sending -= 1
            if ok:
                self.num_sent_pages += num_pages
            else:
                self.num_failed += 1
