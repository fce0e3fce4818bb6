"""The decode worker's side of disaggregation: long uncached deltas are prefilled elsewhere.

An `Extend` whose uncached whole pages (all but the prompt's last token) number at least
`min_tokens / page_size` is parked while a ready prefill peer (the one with the fewest transfers
in flight) computes them. Its pages land in the `InboxTier` under their `page_keys`, and the
Extend then goes the normal way: admission restores the pages, and this worker computes only the
last token, samples, constrains and drafts as always. A transfer that fails or is not back by
`deadline_s` releases the Extend unchanged (it is recomputed here); an Abort of a parked request
releases it first, so the abort answers as for any request.
"""

from __future__ import annotations

import datetime
import logging
import queue
import time
from dataclasses import dataclass, field

import torch
import zmq
from torch._C import _distributed_c10d as c10d

from engine.cache.host_tier import page_keys
from engine.disagg.inbox import InboxTier
from engine.disagg.pair import DECODE_RANK, Pair, PayloadSpec, Receiver, open_group
from engine.disagg.prefill_side import kv_fingerprint
from engine.engine import Engine
from engine.errors import InvalidRequest
from engine.protocol import Abort, Extend, KvAccept, KvConnect, Message, PrefillFor, decode, encode
from engine.worker import Origin, Send

log = logging.getLogger(__name__)

RETRY_S = 2.0  # a refused or broken pair is asked for again after this
ASK_TIMEOUT_S = 10.0  # a KvConnect with no answer (the peer is down) is sent again after this


@dataclass
class _Peer:
    address: str
    socket: zmq.Socket  # type: ignore[type-arg]
    generation: int = 0
    pair: Pair | None = None
    receiver: Receiver | None = None
    num_in_flight: int = 0
    retry_at: float = 0.0
    asked: bool = False  # a KvConnect is out, no KvAccept yet
    refused: str = ""

    @property
    def ready(self) -> bool:
        return self.pair is not None and self.pair.ready and self.receiver is not None


@dataclass
class _Parked:
    origin: Origin
    extend: Extend
    peer: _Peer
    keys: list[bytes]
    deadline: float
    payload: torch.Tensor | None = field(default=None)


class KvPuller:
    """A `LoopHook` for a decode worker with `--prefill-peer` addresses."""

    def __init__(self, engine: Engine, peers: list[str], *, host: str = "127.0.0.1",
                 min_tokens: int = 512, deadline_s: float = 60.0,
                 group_timeout_s: float = 300.0) -> None:
        """`host`: this worker's address as the prefill peers reach it (the gloo socket)."""
        self.engine = engine
        if engine.swa is not None:
            raise InvalidRequest("disaggregated prefill moves whole pages of every layer; run "
                                 "a sliding-window model with --no-swa-memory for it")
        self.host = host
        self.min_tokens = min_tokens
        self.deadline_s = deadline_s
        self.group_timeout_s = group_timeout_s
        kv = engine.kv_pool
        self.spec = PayloadSpec(len(kv.k), tuple(kv.k[0].shape[1:]), kv.k[0].dtype)
        self.inbox = InboxTier(kv, kv.layout.num_pages)
        engine.scheduler.tiers.append(self.inbox)
        self._context = zmq.Context()
        self._peers = [self._open_peer(address) for address in peers]
        self._parked: dict[int, _Parked] = {}  # tag -> parked request
        self._landed: queue.Queue[tuple[int, torch.Tensor | None]] = queue.Queue()
        self._next_tag = 0
        self.num_fallbacks = 0
        self.num_failed = 0

    @property
    def busy(self) -> bool:
        return bool(self._parked) or any(p.asked for p in self._peers)

    def stats(self) -> dict[str, int]:
        return {"num_kv_peers": sum(p.ready for p in self._peers),
                "num_kv_received_pages": self.inbox.num_received,
                "num_kv_failed_transfers": self.num_failed,
                "num_kv_fallbacks": self.num_fallbacks}

    def close(self) -> None:
        for peer in self._peers:
            peer.socket.close(linger=0)
        self._context.term()

    def intercept(self, origin: Origin, message: Message,
                  send: Send) -> list[tuple[Origin, Message]] | None:
        if isinstance(message, Abort):
            for tag, parked in list(self._parked.items()):
                if parked.extend.request_id == message.request_id:
                    del self._parked[tag]
                    return [(parked.origin, parked.extend), (origin, message)]
            return None
        if not isinstance(message, Extend):
            return None
        plan = self._plan(message)
        if plan is None:
            return None
        peer, token_ids, first = plan
        tag = self._next_tag
        self._next_tag += 1
        num_pages = len(token_ids) // self.engine.kv_pool.layout.page_size
        keys = page_keys(message.namespace, token_ids, self.inbox.page_size, num_pages)[first:]
        self._parked[tag] = _Parked(origin, message, peer, keys,
                                    time.monotonic() + self.deadline_s)
        peer.num_in_flight += 1
        assert peer.pair is not None and peer.receiver is not None
        peer.receiver.expect(tag)
        peer.socket.send(encode(PrefillFor(peer.pair.name, tag, message.namespace, token_ids,
                                           first)))
        return []

    def tick(self, send: Send) -> list[tuple[Origin, Message]]:
        """Keep pairs formed; return the parked requests whose pages landed or never will."""
        now = time.monotonic()
        for peer in self._peers:
            self._keep_pair(peer, now)
        released: list[tuple[Origin, Message]] = []
        while True:
            try:
                tag, payload = self._landed.get_nowait()
            except queue.Empty:
                break
            parked = self._parked.pop(tag, None)
            if parked is None:
                continue  # released already (deadline, abort): its pages are not needed
            parked.peer.num_in_flight -= 1
            if payload is not None and payload.shape[0] == len(parked.keys):
                self.inbox.put(parked.keys, payload)
            else:
                self.num_failed += 1
                self.num_fallbacks += 1
            released.append((parked.origin, parked.extend))
        for tag, parked in list(self._parked.items()):
            pair = parked.peer.pair
            if now > parked.deadline and pair is not None and not pair.broken:
                # A peer this late is hung or overloaded: stop sending it work; a new pair is
                # asked for, and while none forms requests run here.
                log.warning("KV transfer %d from %s is past its deadline; recomputing it",
                            tag, parked.peer.address)
                pair.broken = True
            if now > parked.deadline or pair is None or pair.broken:
                del self._parked[tag]
                parked.peer.num_in_flight -= 1
                self.num_fallbacks += 1
                released.append((parked.origin, parked.extend))
        return released

    def on_output(self, out: Message) -> None:
        pass

    # ----- internals -----

    def _plan(self, message: Extend) -> tuple[_Peer, list[int], int] | None:
        """(peer, the prompt's whole pages but its last token's, first uncached page) when the
        request is worth prefilling elsewhere, else None."""
        ready = [p for p in self._peers if p.ready]
        if not ready or message.resume_output_ids:
            return None
        prompt = list(message.token_ids)
        if message.parent_ref is not None:
            ref = self.engine.cache.lookup_turn(message.parent_ref)
            if ref is None or ref.namespace != message.namespace:
                return None  # the normal path answers unknown_parent
            prompt = list(ref.token_ids) + prompt
        page_size = self.inbox.page_size
        num_pages = (len(prompt) - 1) // page_size
        first = self.engine.cache.cached_prefix_len(message.namespace, prompt) // page_size
        if (num_pages - first) * page_size < self.min_tokens:
            return None
        vocab_size = self.engine.loaded.model.config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            return None  # the normal path answers invalid_request
        peer = min(ready, key=lambda p: p.num_in_flight)
        return peer, prompt[:num_pages * page_size], first

    def _open_peer(self, address: str) -> _Peer:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        return _Peer(address, sock)

    def _keep_pair(self, peer: _Peer, now: float) -> None:
        while peer.socket.poll(0):
            try:
                reply = decode(peer.socket.recv())
            except ValueError:
                continue
            if isinstance(reply, KvAccept) and peer.asked and reply.decode_key == self._key(peer):
                peer.asked = False
                self._accept(peer, reply, now)
        if (peer.pair is not None and not peer.pair.broken) or now < peer.retry_at:
            return
        peer.generation += 1  # a new key: whatever the peer kept of an older pair is not reused
        peer.pair, peer.receiver, peer.asked = None, None, True
        peer.retry_at = now + ASK_TIMEOUT_S  # asked again if no answer comes by then
        peer.socket.send(encode(KvConnect(self._key(peer), kv_fingerprint(self.engine))))

    def _accept(self, peer: _Peer, reply: KvAccept, now: float) -> None:
        if reply.error:
            if reply.error != peer.refused:
                log.warning("prefill peer %s refused KV transfer: %s", peer.address, reply.error)
            peer.refused, peer.retry_at = reply.error, now + RETRY_S
            return
        key, timeout_s = self._key(peer), self.group_timeout_s
        store_host, store_port, host = reply.store_host, reply.store_port, self.host

        def join() -> c10d.ProcessGroupGloo:
            store = c10d.TCPStore(store_host, store_port, is_master=False,
                                  timeout=datetime.timedelta(seconds=timeout_s))
            return open_group(store, key, DECODE_RANK, host, timeout_s)

        peer.pair = Pair(join, key)
        peer.receiver = Receiver(peer.pair, self.spec, lambda tag, p: self._landed.put((tag, p)))
        peer.retry_at = now + RETRY_S

    def _key(self, peer: _Peer) -> str:
        return f"{self.engine.worker_id}-{self._peers.index(peer)}-{peer.generation}"
