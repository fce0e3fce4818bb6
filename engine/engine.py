"""The synchronous engine core: requests in, token chunks and results out, one step at a time.

`submit` validates and queues; `step` runs one batched forward and returns the messages it
produced. Threads, processes and sockets live elsewhere (`engine.worker`, `engine.server`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.attention.registry import get_backend
from engine.cache.base import PrefixCache
from engine.cache.no_cache import NoPrefixCache
from engine.cache.page_pool import PagePool
from engine.cache.radix_cache import RadixCache
from engine.core import Request
from engine.errors import EngineError, InvalidRequest, RequestTooLong, UnknownParent
from engine.kv_pool import KVPool, plan_kv_layout
from engine.model_runner import ModelRunner
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Failed, Finished, Message, Stats, Timings, TokenChunk
from engine.sampling import make_generator, sample_batch
from engine.scheduler.scheduler import Scheduler
from engine.stopping import TextStopper


@dataclass(frozen=True)
class EngineConfig:
    page_size: int = 16
    kv_memory_bytes: int = 1 << 30
    max_running: int = 32
    max_batch_tokens: int = 1024  # tokens per step: decodes plus prefill chunks
    enable_prefix_cache: bool = True
    attention_backend: str = "torch"
    check_invariants: bool = False  # run every structure's check_invariants() after each step


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.loaded = loaded
        self.config = config or EngineConfig()
        self.clock = clock
        model = loaded.model
        layout = plan_kv_layout(model.config, self.config.kv_memory_bytes, self.config.page_size,
                                model.dtype)
        self.kv_pool = KVPool(model.config, layout, model.dtype)
        self.page_pool = PagePool(layout.num_pages)
        self.cache: PrefixCache = (
            RadixCache(self.page_pool, layout.page_size, clock=clock)
            if self.config.enable_prefix_cache else NoPrefixCache(self.page_pool, layout.page_size))
        self.scheduler = Scheduler(self.cache, self.page_pool, layout.page_size,
                                   max_running=self.config.max_running,
                                   max_batch_tokens=self.config.max_batch_tokens, clock=clock)
        self.runner = ModelRunner(model, self.kv_pool, get_backend(self.config.attention_backend))
        self.num_finished = 0

    # ----- requests -----

    def submit(self, extend: Extend) -> list[Message]:
        """Queue a request. Returns `[Failed]` at once if it cannot run, else `[]`."""
        try:
            self.scheduler.add(self._make_request(extend))
        except EngineError as exc:
            return [Failed(extend.request_id, exc.error_type, str(exc))]
        return []

    def abort(self, request_id: str) -> list[Message]:
        req = self.scheduler.find(request_id)
        if req is None:
            return []
        self.scheduler.remove(req)
        req.finish_reason = "abort"
        return [self._finished(req)]

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[Message]:
        """Run one scheduled batch. Returns the token chunks and final messages it produced."""
        items = self.scheduler.schedule()
        if not items:
            return []
        logits = self.runner.run(items)
        sampled = [item.request for item in items if item.needs_sample]
        for item in items:
            item.request.num_computed += item.num_tokens
        choices = sample_batch(logits, [r.params for r in sampled], [r.generator for r in sampled])
        out: list[Message] = []
        now = self.clock()
        for req, choice in zip(sampled, choices, strict=True):
            out.extend(self._accept_token(req, choice.token_id, choice.logprob,
                                          choice.top_logprobs, now))
        if self.config.check_invariants:
            self.check_invariants()
        return out

    def run_until_idle(self) -> list[Message]:
        """Step until nothing is queued or running (tests, benchmarks, `generate`)."""
        out: list[Message] = []
        while self.has_work:
            out.extend(self.step())
        return out

    # ----- turns and cache -----

    def pin(self, turn_id: str, ttl_s: float) -> bool:
        return self.cache.pin(turn_id, ttl_s)

    def unpin(self, turn_id: str) -> None:
        self.cache.unpin(turn_id)

    def reset_cache(self) -> None:
        """Drop every unlocked cached prefix (cold-cache benchmarks)."""
        self.cache.reset()

    def stats(self, request_id: str = "") -> Stats:
        s = self.scheduler
        return Stats(request_id, len(s.running), len(s.waiting), self.page_pool.num_pages,
                     self.page_pool.num_free_pages, self.cache.num_cached_pages,
                     s.prefix_query_tokens, s.prefix_hit_tokens, self.num_finished,
                     self.loaded.name, self.kv_pool.layout.page_size)

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()

    # ----- internals -----

    def _make_request(self, extend: Extend) -> Request:
        tok = self.loaded.tokenizer
        cfg = self.loaded.model.config
        prompt = list(extend.token_ids)
        if extend.parent_ref is not None:
            ref = self.cache.lookup_turn(extend.parent_ref)
            if ref is None or ref.namespace != extend.namespace:
                raise UnknownParent(f"turn '{extend.parent_ref}' is not cached on this engine")
            prompt = list(ref.token_ids) + prompt
        if not prompt:
            raise InvalidRequest("the request has no tokens")
        if min(prompt) < 0 or max(prompt) >= cfg.vocab_size:
            raise InvalidRequest(f"token ids must be in [0, {cfg.vocab_size})")
        total = len(prompt) + extend.sampling.max_tokens
        if total > cfg.max_position_embeddings:
            raise RequestTooLong(
                f"{len(prompt)} prompt tokens + max_tokens {extend.sampling.max_tokens} exceed "
                f"the model context of {cfg.max_position_embeddings}")
        if -(-total // self.kv_pool.layout.page_size) > self.page_pool.num_pages:
            raise RequestTooLong(
                f"{total} tokens exceed the KV pool ({self.kv_pool.layout.num_tokens} tokens); "
                "raise --kv-memory")
        stop_ids = set(extend.sampling.stop_token_ids)
        if not extend.sampling.ignore_eos:
            stop_ids.update(tok.stop_token_ids)
        return Request(
            request_id=extend.request_id, namespace=extend.namespace, prompt_ids=prompt,
            params=extend.sampling, stop_ids=frozenset(stop_ids),
            stopper=TextStopper(tok.stream_decoder(), extend.sampling.stop),
            generator=make_generator(extend.sampling), arrival_s=self.clock(),
            bind_turn_id=extend.bind_turn_id, session_id=extend.session_id)

    def _accept_token(self, req: Request, token_id: int, logprob: float | None,
                      top: list[tuple[int, float]] | None, now: float) -> list[Message]:
        if req.first_token_s is None:
            req.first_token_s = now
        if token_id in req.stop_ids:
            req.stop_token_id = token_id
            req.finish_reason = "stop"
            return self._complete(req, [], "", None, None)
        req.output_ids.append(token_id)
        text = req.stopper.feed(token_id)
        if req.stopper.stopped:
            req.finish_reason = "stop"
        elif len(req.output_ids) >= req.params.max_tokens:
            req.finish_reason = "length"
        logprobs = [logprob] if logprob is not None else None
        tops = [top] if top is not None else None
        if req.finish_reason is None:
            return [TokenChunk(req.request_id, [token_id], text, logprobs, tops)]
        return self._complete(req, [token_id], text, logprobs, tops)

    def _complete(self, req: Request, token_ids: list[int], text: str,
                  logprobs: list[float] | None,
                  tops: list[list[tuple[int, float]]] | None) -> list[Message]:
        text += req.stopper.finish()
        self.scheduler.finish(req)
        out: list[Message] = []
        if token_ids or text:
            out.append(TokenChunk(req.request_id, token_ids, text, logprobs, tops))
        out.append(self._finished(req))
        return out

    def _finished(self, req: Request) -> Finished:
        self.num_finished += 1
        now = self.clock()
        first = req.first_token_s if req.first_token_s is not None else now
        scheduled = req.first_scheduled_s if req.first_scheduled_s is not None else now
        cached = req.first_cached_len or 0
        bound_len = 0
        if req.bind_turn_id is not None and req.finish_reason != "abort":
            bound_len = req.seq_len + (1 if req.stop_token_id is not None else 0)
        return Finished(
            request_id=req.request_id, finish_reason=req.finish_reason or "abort",
            output_token_ids=list(req.output_ids), text=req.stopper.final_text,
            prompt_len=len(req.prompt_ids), cached_len=cached,
            computed_len=len(req.prompt_ids) - cached, output_len=len(req.output_ids),
            timings=Timings(queue_s=scheduled - req.arrival_s, prefill_s=first - scheduled,
                            decode_s=now - first, ttft_s=first - req.arrival_s),
            bound_turn_id=req.bind_turn_id if bound_len else None, bound_token_len=bound_len,
            stop_token_id=req.stop_token_id)
