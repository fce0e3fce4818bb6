"""The synchronous engine core: requests in, token chunks and results out, one step at a time.

`submit` validates and queues; `step` runs one batched forward and returns the messages it
produced. Threads, processes and sockets live elsewhere (`engine.worker`, `engine.server`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import torch

from engine.attention.registry import backend_for
from engine.cache.base import SlidingWindow
from engine.cache.disk_tier import DiskTier
from engine.cache.factory import build_cache
from engine.cache.page_pool import PagePool
from engine.constrained.base import TokenGrammar
from engine.constrained.spec import ToolConstraint
from engine.constrained.xgrammar_backend import XGrammarBackend, XGrammarState
from engine.core import Request
from engine.cuda_graph import make_static_decode
from engine.deterministic import deterministic_setup
from engine.engine_config import EngineConfig, swa_memory_applies
from engine.engine_stats import engine_stats
from engine.errors import EngineError, InvalidRequest
from engine.kv_pool import KVPool, plan_kv_layout
from engine.model_runner import ModelRunner
from engine.models.loader import LoadedModel, place_model
from engine.protocol import Extend, Failed, Finished, Message, Stats, TokenChunk
from engine.request_limits import context_len, finished_of, make_request
from engine.sampling import TokenChoice, sample_batch
from engine.scheduler.queue_estimate import QueueEstimator, prefill_rows
from engine.scheduler.scheduler import Scheduler
from engine.spec.factory import make_speculator
from engine.spec.speculator import Speculator, Verified
from engine.tp.launch import TensorParallel

__all__ = ["Engine", "EngineConfig"]  # EngineConfig lives in engine.engine_config


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or EngineConfig()
        # --tp: the whole model stays on the host until it is split (engine.tp).
        self.loaded = place_model(loaded, self.config.device if self.config.tp == 1 else "cpu")
        invariant_backend = None
        if self.config.deterministic:
            self.loaded, invariant_backend = deterministic_setup(self.loaded, self.config.device)
        # This process becomes rank 0 and keeps its shard; the followers start here.
        self.tp = TensorParallel(self.loaded, self.config) if self.config.tp != 1 else None
        if self.tp is not None:
            self.loaded = place_model(self.tp.loaded, str(self.tp.device))
        self.clock = clock
        model = self.loaded.model
        self.context_len = context_len(model.config.max_position_embeddings,
                                       self.config.max_context)
        c = self.config
        layout = plan_kv_layout(model.config, c.kv_memory_bytes, c.page_size, model.kv_dtype,
                                swa_ratio=c.swa_ratio if swa_memory_applies(c, model) else None,
                                chunk_tokens=c.max_batch_tokens)
        self.kv_pool = KVPool(model.config, layout, model.kv_dtype, device=model.device)
        self.page_pool = PagePool(layout.num_pages)
        self.swa = (SlidingWindow(PagePool(layout.num_swa_pages), model.config.sliding_window)
                    if layout.has_swa and model.config.sliding_window else None)
        self.cache, self.tiers = build_cache(
            self.page_pool, self.kv_pool, enable_prefix_cache=c.enable_prefix_cache,
            host_kv_memory_bytes=c.host_kv_memory_bytes, kv_dir=c.kv_dir,
            kv_disk_bytes=c.kv_disk_bytes, clock=clock, fingerprint=DiskTier.fingerprint(
                self.loaded.name, self.loaded.tokenizer.vocab_hash, self.kv_pool), swa=self.swa)
        self.scheduler = Scheduler(self.cache, self.page_pool, layout.page_size,
                                   max_running=self.config.max_running,
                                   max_batch_tokens=self.config.max_batch_tokens, clock=clock,
                                   tiers=self.tiers.all, swa=self.swa)
        backend = invariant_backend or backend_for(self.config.attention_backend,
                                                   model.attention_specs)
        self.runner = self.tp.runner(self.kv_pool, backend) if self.tp is not None else (
            ModelRunner(model, self.kv_pool, backend, make_static_decode(
                model, self.kv_pool, backend.name, self.config.max_running,
                self.config.cuda_graphs)))
        self.num_finished = 0
        self.queue = QueueEstimator()  # measured rates behind the load shedder's estimates
        self.worker_id = uuid.uuid4().hex[:12]  # a restarted worker holds no KV: a new id
        self.speculator: Speculator | None = make_speculator(
            self.config.spec, self.config.max_draft_len, self.loaded, self.config.draft_backoff,
            self.config.draft_topk, self.config.draft_steps)
        if self.speculator is not None and self.speculator.draws_trees and (
                self.kv_pool.layout.has_swa or not getattr(backend, "supports_tree_masks", False)
                or any(s.window is not None for s in model.attention_specs)):
            raise InvalidRequest(f"tree drafts (--draft-topk {self.config.draft_topk}) need "
                                 "full-attention layers and an attention backend with tree "
                                 f"masks; this model or backend ({backend.name}) has not: use "
                                 "--draft-topk 1")
        self._grammars: XGrammarBackend | None = None  # built by the first constrained request

    # ----- requests -----

    def submit(self, extend: Extend) -> list[Message]:
        """Queue a request. Returns `[Failed]` at once if it cannot run, else `[]`."""
        arrival_s = self.clock()  # the engine's time starts here, request setup included
        try:
            req = self._make_request(extend, arrival_s)
        except EngineError as exc:
            return [Failed(extend.request_id, exc.error_type, str(exc))]
        req.queued_cached_len = self.cache.cached_prefix_len(req.namespace, req.prompt_ids)
        self.queue.arrived(extend.bind_turn_id, arrival_s)
        self.scheduler.add(req)
        return []

    def queue_wait_s(self, num_new_tokens: int, *, reserve_for: str = "",
                     max_wait_s: float = 0.0) -> float:
        """Estimated seconds before a request with `num_new_tokens` uncached prompt tokens,
        submitted now, gets its first token (`engine.scheduler.queue_estimate`). Within a
        `max_wait_s` > 0, its tokens stay reserved until a request binding `reserve_for`
        arrives."""
        s, now = self.scheduler, self.clock()
        self.queue.arrived(None, now)
        wait = self.queue.wait_s(s.waiting, s.running, s.max_running, num_new_tokens)
        if max_wait_s > 0:
            self.queue.admit(reserve_for, num_new_tokens, wait, max_wait_s, now)
        return wait

    def abort(self, request_id: str) -> list[Message]:
        req = self.scheduler.find(request_id)
        if req is None:
            return []
        self.scheduler.remove(req)
        req.finish_reason = "abort"
        return [self._finished(req)]

    def fail_all(self, error_type: str, message: str) -> list[Message]:
        """End every queued and running request with `Failed` (a step raised). Each goes
        through the abort path: its pages return to the pool, its drafter state (suffix corpus,
        draft-model KV) is released, and it counts as finished."""
        out: list[Message] = []
        for req in [*self.scheduler.running, *self.scheduler.waiting]:
            self.scheduler.remove(req)
            req.finish_reason = "abort"
            self._finished(req)
            out.append(Failed(req.request_id, error_type, message))
        return out

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[Message]:
        """Run one scheduled batch. Returns the token chunks and final messages it produced."""
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, self.context_len)
        started_s = self.clock()
        items = self.scheduler.schedule()
        if not items:
            return []
        num_prefill = sum(prefill_rows(item.request, item.start, item.num_tokens - item.num_draft)
                          for item in items)
        if self.speculator is not None and self.speculator.capture_layers:
            logits, aux = self.runner.run_captured(items, self.speculator.capture_layers)
            if aux is not None:
                self.speculator.record_features(items, aux)
        else:
            logits = self.runner.run(items)
        sampled_items = [item for item in items if item.needs_sample]
        for item in items:
            item.request.num_computed += item.num_tokens - item.num_draft
        out: list[Message] = []
        # The clock is read once the tokens are chosen: a token's time (TTFT) is when it can
        # be sent, sampling included.
        if self.speculator is None or not any(item.num_draft for item in sampled_items):
            sampled = [item.request for item in sampled_items]
            choices = self._choose(logits, sampled)
            now = self.clock()
            for req, choice in zip(sampled, choices, strict=True):
                out.extend(self._accept_token(req, choice.token_id, choice.logprob,
                                              choice.top_logprobs, now))
        else:
            verified_rows = self.speculator.choose(sampled_items, logits, self._choose,
                                                   self._mask_row)
            now = self.clock()
            for verified in verified_rows:
                out.extend(self._accept_verified(verified, now))
        self.queue.record_step(num_prefill, self.clock() - started_s)
        # Positions advanced: sliding-window pages that left every window go back.
        self.scheduler.trim_windows()
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
        pinned = self.cache.pin(turn_id, ttl_s)
        if pinned:
            self.tiers.save_pinned(self.cache, turn_id)
        return pinned

    def unpin(self, turn_id: str) -> None:
        self.cache.unpin(turn_id)

    def reset_cache(self) -> None:
        """Drop every unlocked cached prefix (cold-cache benchmarks)."""
        self.cache.reset()

    def stats(self, request_id: str = "") -> Stats:
        return engine_stats(self, request_id)

    def close(self) -> None:
        """Stop the tensor-parallel followers, if any; the engine cannot step after."""
        if self.tp is not None:
            self.tp.close()

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()
        if self.speculator is not None:
            self.speculator.check_invariants()

    # ----- internals -----

    def _make_request(self, extend: Extend, arrival_s: float) -> Request:
        return make_request(extend, arrival_s, cache=self.cache, loaded=self.loaded,
                            context_len=self.context_len,
                            pool_tokens=self.kv_pool.layout.num_tokens,
                            grammar_for=self._grammar_for)

    def _grammar_for(self, constraint: ToolConstraint, stop_ids: set[int]) -> XGrammarState:
        """Raises `InvalidRequest` without stop ids (the grammar needs an end) and
        `InvalidToolSchema` for schemas the backend cannot compile."""
        if not stop_ids:
            raise InvalidRequest("a tool-call constraint needs a stop token (drop ignore_eos)")
        if self._grammars is None:
            self._grammars = XGrammarBackend(self.loaded.tokenizer,
                                             self.loaded.model.config.vocab_size)
        return self._grammars.new_grammar(constraint, sorted(stop_ids))

    def _choose(self, logits: torch.Tensor, sampled: list[Request]) -> list[TokenChoice]:
        """One token per row of `logits` (one row per request), grammar masks applied."""
        if self._grammars is not None and any(r.grammar is not None for r in sampled):
            self._grammars.mask_logits(logits, [r.grammar for r in sampled])
        return sample_batch(logits, [r.params for r in sampled], [r.generator for r in sampled])

    def _mask_row(self, row: torch.Tensor, grammar: TokenGrammar) -> None:
        if self._grammars is not None:
            self._grammars.mask_logits(row, [grammar])

    def _accept_verified(self, verified: Verified, now: float) -> list[Message]:
        """Emit a drafted request's tokens in order until one finishes it. The first
        `num_accepted` are draft tokens whose KV the verify forward already wrote."""
        req = verified.request
        assert self.speculator is not None
        if verified.kv_rows:
            self.runner.move_rows(req, req.num_computed, verified.kv_rows)
        self.speculator.record(req, verified.num_drafted, 0)
        out: list[Message] = []
        for i, choice in enumerate(verified.choices):
            is_draft = i < verified.num_accepted
            if is_draft:  # counted before a stop inside the draft can finish the request
                self.speculator.record(req, 0, 1)
            out.extend(self._accept_token(req, choice.token_id, choice.logprob,
                                          choice.top_logprobs, now, kv_written=is_draft))
            if req.finish_reason is not None:
                break
        return out

    def _accept_token(self, req: Request, token_id: int, logprob: float | None,
                      top: list[tuple[int, float]] | None, now: float,
                      kv_written: bool = False) -> list[Message]:
        if req.first_token_s is None:
            req.first_token_s = now
        if req.grammar is not None:
            # The mask allowed only grammatical tokens, so this cannot fail.
            accepted = req.grammar.accept_token(token_id)
            assert accepted, f"{req.request_id}: grammar rejected its own masked token {token_id}"
        if token_id in req.stop_ids:
            req.stop_token_id = token_id
            req.finish_reason = "stop"
            return self._complete(req, [], "", None, None)
        req.output_ids.append(token_id)
        if kv_written:
            req.num_computed += 1
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
        if self.speculator is not None:  # first: the drafter reads how far it was computed
            self.speculator.finish(req)
        self.scheduler.finish(req)
        out: list[Message] = []
        if token_ids or text:
            out.append(TokenChunk(req.request_id, token_ids, text, logprobs, tops))
        out.append(self._finished(req, drafter_done=True))
        return out

    def _finished(self, req: Request, drafter_done: bool = False) -> Finished:
        self.num_finished += 1
        self.queue.record_finish(self.clock())
        if self.speculator is not None and not drafter_done:
            self.speculator.finish(req)
        return finished_of(req, self.clock(), self.worker_id)
