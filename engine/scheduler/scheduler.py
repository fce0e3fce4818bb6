"""Continuous batching with chunked prefill over a paged KV pool and a prefix cache.

Each step schedules every running decode (one token each) and then prefill chunks, oldest request
first, until the token budget is spent. Pages are taken for exactly the tokens scheduled; when the
pool runs dry the prefix cache is evicted first, then the newest running request is preempted
(its pages freed; it recomputes later, reusing whatever prefix is still cached).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.cache.base import PrefixCache, SlidingWindow
from engine.cache.host_tier import KVTier, restore
from engine.cache.page_pool import PagePool
from engine.core import Phase, Request
from engine.scheduler import shared_prefix


@dataclass(frozen=True)
class ScheduledItem:
    request: Request
    start: int  # first position computed this step (== request.num_computed before the step)
    num_tokens: int  # rows this step, draft tokens included
    num_draft: int = 0  # trailing rows that are the request's draft_ids, verified after

    @property
    def needs_sample(self) -> bool:
        return self.start + self.num_tokens - self.num_draft == self.request.seq_len


class Scheduler:
    def __init__(self, cache: PrefixCache, pool: PagePool, page_size: int, *, max_running: int,
                 max_batch_tokens: int, clock: Callable[[], float],
                 tiers: Sequence[KVTier] = (), swa: SlidingWindow | None = None) -> None:
        """`swa`: the sliding-window layers have their own page pool; a request holds their
        pages only for the last window (given back as it moves, `trim_windows`)."""
        self.cache = cache
        self.tiers = list(tiers)  # where pages missing from the cache are restored from
        self.pool = pool
        self.page_size = page_size
        self.max_running = max_running
        self.max_batch_tokens = max_batch_tokens
        self.clock = clock
        self.swa = swa
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: oldest first
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    # ----- public API -----

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def find(self, request_id: str) -> Request | None:
        for req in (*self.running, *self.waiting):
            if req.request_id == request_id:
                return req
        return None

    def remove(self, request: Request) -> None:
        """Take a request out of the queues and release its pages (abort or finish)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._release(request)
        request.phase = Phase.FINISHED

    def finish(self, request: Request) -> None:
        """Cache the request's computed KV (whole pages), bind its turn, then release it."""
        computed = request.all_ids[: request.num_computed]
        num_full = len(computed) // self.page_size
        inserted = self.cache.insert(request.namespace, computed[: num_full * self.page_size],
                                     request.page_ids[:num_full],
                                     request.swa_page_ids[:num_full] if self.swa else None)
        if self.swa is None:
            shared_prefix.publish(self.cache, request, request.page_ids, num_full)
        if request.bind_turn_id is not None:
            tail = request.all_ids[num_full * self.page_size :]
            if request.stop_token_id is not None:
                tail.append(request.stop_token_id)
            self.cache.bind_turn(request.bind_turn_id, inserted.node, tail)
        self.remove(request)

    def schedule(self) -> list[ScheduledItem]:
        """Pick this step's work; allocates pages for it. May preempt running requests."""
        items: list[ScheduledItem] = []
        budget = self.max_batch_tokens
        # Decodes first: they cost one token each and keep streams flowing.
        for req in sorted(self.running, key=lambda r: not r.is_decoding):
            if req not in self.running:
                continue  # preempted while making room for an older request
            num_tokens = min(req.num_remaining + len(req.draft_ids), budget)
            if num_tokens <= 0:
                continue
            if num_tokens > req.num_remaining and not self._reserve(
                    req, req.num_computed + num_tokens, evict=False):
                # Drafts are a bet: they never evict cache or preempt anyone for room.
                num_tokens = min(req.num_remaining, budget)
            if not self._reserve_or_preempt(req, req.num_computed + num_tokens, items):
                continue
            num_draft = max(0, num_tokens - req.num_remaining)
            items.append(ScheduledItem(req, req.num_computed, num_tokens, num_draft))
            budget -= num_tokens
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            req = self.waiting[0]
            if not self._admit(req):
                break
            self.waiting.popleft()
            self.running.append(req)
            num_tokens = min(req.num_remaining, budget)
            if not self._reserve(req, req.num_computed + num_tokens):
                self._preempt(req)
                break
            items.append(ScheduledItem(req, req.num_computed, num_tokens))
            budget -= num_tokens
        now = self.clock()
        for item in items:
            if item.request.first_scheduled_s is None:
                item.request.first_scheduled_s = now
        return items

    def trim_windows(self) -> int:
        """Give back every running request's sliding-window pages that no query of it can read
        any more (wholly before its next position's window), except the window before its
        prompt's end: a retry or fork of this turn's output resumes there. Returns the number
        given back."""
        if self.swa is None:
            return 0
        dropped = 0
        ps = self.page_size
        for req in self.running:
            keep_from = self.swa.first_needed_page(req.num_computed, ps)
            prompt_end = (len(req.prompt_ids) - 1) // ps  # where a resample's match ends
            kept = range(self.swa.first_needed_page(prompt_end * ps, ps), prompt_end)
            gone = [i for i in range(min(keep_from, len(req.swa_page_ids)))
                    if req.swa_page_ids[i] >= 0 and i not in kept]
            if gone:
                self.swa.pool.decref([req.swa_page_ids[i] for i in gone])
                for i in gone:
                    req.swa_page_ids[i] = -1
                dropped += len(gone)
        return dropped

    def check_invariants(self) -> None:
        owned: dict[int, int] = {}
        swa_owned: dict[int, int] = {}
        for req in self.running:
            assert req.phase is Phase.RUNNING, f"{req.request_id} in running with {req.phase}"
            need = -(-req.num_computed // self.page_size)
            assert len(req.page_ids) >= need, f"{req.request_id} lacks pages for its KV"
            for page_id in req.page_ids:
                owned[page_id] = owned.get(page_id, 0) + 1
            if self.swa is not None:
                assert len(req.swa_page_ids) == len(req.page_ids), f"{req.request_id}: swa pages"
                window = self.swa.first_needed_page(req.num_computed, self.page_size)
                for i, page_id in enumerate(req.swa_page_ids):
                    assert page_id >= 0 or i < window, f"{req.request_id}: window page {i} gone"
                    if page_id >= 0:
                        swa_owned[page_id] = swa_owned.get(page_id, 0) + 1
        if self.swa is not None:
            for page_id, count in swa_owned.items():
                assert self.swa.pool.ref_count(page_id) >= count, f"swa page {page_id} under-held"
            self.swa.pool.check_invariants()
        for req in self.waiting:
            assert not req.page_ids and req.lock_node is None, f"waiting {req.request_id} holds KV"
            assert not req.swa_page_ids, f"waiting {req.request_id} holds sliding-window KV"
        for page_id, count in owned.items():
            assert self.pool.ref_count(page_id) >= count, f"page {page_id} under-referenced"
        self.pool.check_invariants()
        self.cache.check_invariants()
        for tier in self.tiers:
            tier.check_invariants()

    # ----- internals -----

    def _admit(self, req: Request) -> bool:
        """Match the cached prefix and take references on it. False if it cannot start now."""
        # At least one token must run through the model to produce the next token's logits.
        limit = (req.seq_len - 1) // self.page_size
        if self.swa is None:
            shared_prefix.adopt(self.cache, self.pool, self.tiers, req, limit)
        for tier in self.tiers:
            restore(tier, self.cache, self.pool, req.namespace, req.all_ids, limit)
        # Matched up to the limit, so that (with sliding-window memory) the window the first
        # computed row reads is checked at the point it is read from.
        match = self.cache.match_prefix(req.namespace, req.all_ids[: limit * self.page_size])
        num_pages = len(match.page_ids)
        need = -(-(req.seq_len - num_pages * self.page_size) // self.page_size)
        if need > self.pool.num_free_pages + self.cache.num_evictable_pages:
            return False
        page_ids = match.page_ids
        self.pool.incref(page_ids)
        self.cache.lock(match.node)
        req.lock_node = match.node
        req.page_ids = list(page_ids)
        if self.swa is not None:
            req.swa_page_ids = list(match.swa_page_ids)
            self.swa.pool.incref([p for p in req.swa_page_ids if p >= 0])
        req.cached_len = req.num_computed = num_pages * self.page_size
        if req.first_cached_len is None:
            req.first_cached_len = req.cached_len
            self.prefix_query_tokens += req.seq_len
            self.prefix_hit_tokens += req.cached_len
        req.phase = Phase.RUNNING
        return True

    def _reserve(self, req: Request, target_len: int, *, evict: bool = True) -> bool:
        need = -(-target_len // self.page_size) - len(req.page_ids)
        if need <= 0:
            return True
        short = need - self.pool.num_free_pages
        if short > 0 and evict:
            self.cache.evict(short)
        if self.swa is not None:
            swa_short = need - self.swa.pool.num_free_pages
            if swa_short > 0 and evict:
                self.cache.evict_swa(swa_short)
            if self.swa.pool.num_free_pages < need:
                return False
        if self.pool.num_free_pages < need:
            return False
        req.page_ids.extend(self.pool.alloc(need))
        if self.swa is not None:
            req.swa_page_ids.extend(self.swa.pool.alloc(need))
        return True

    def _reserve_or_preempt(self, req: Request, target_len: int,
                            items: list[ScheduledItem]) -> bool:
        scheduled = {item.request for item in items}
        while not self._reserve(req, target_len):
            victims = [r for r in reversed(self.running) if r is not req and r not in scheduled]
            victim = victims[0] if victims else req
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        """Free the request's pages; it goes back to the front of the queue to recompute."""
        self.running.remove(req)
        self._release(req)
        req.phase = Phase.WAITING
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    def _release(self, req: Request) -> None:
        if req.page_ids:
            self.pool.decref(req.page_ids)
        if self.swa is not None and req.swa_page_ids:
            self.swa.pool.decref([p for p in req.swa_page_ids if p >= 0])
        req.swa_page_ids = []
        if req.lock_node is not None:
            self.cache.unlock(req.lock_node)
        req.page_ids = []
        req.lock_node = None
        req.num_computed = 0
        req.cached_len = 0
