"""What a request is held to from admission to result: its tokens are valid and its parent is
cached here, its output fits the room left in the context and the KV pool, an earlier attempt's
output replays as if just sampled, and its result carries its timings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from engine.cache.base import PUBLIC_NAMESPACE, PrefixCache
from engine.constrained.base import TokenGrammar
from engine.constrained.spec import ToolConstraint
from engine.core import Request
from engine.errors import InvalidRequest, RequestTooLong, UnknownParent
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished, Timings
from engine.sampling import make_generator
from engine.sampling_params import SamplingParams
from engine.stopping import TextStopper


def make_request(extend: Extend, arrival_s: float, *, cache: PrefixCache, loaded: LoadedModel,
                 context_len: int, pool_tokens: int,
                 grammar_for: Callable[[ToolConstraint, set[int]], TokenGrammar]) -> Request:
    """The engine request of `extend` (its parent's cached tokens, then its own). Raises
    InvalidRequest (bad tokens, the public namespace, no tokens), UnknownParent (the parent is
    not cached here, or in another namespace), RequestTooLong and the grammar's errors."""
    tok = loaded.tokenizer
    cfg = loaded.model.config
    prompt = list(extend.token_ids)
    if extend.namespace == PUBLIC_NAMESPACE:
        raise InvalidRequest("the public cache namespace is not a request's namespace")
    if extend.parent_ref is not None:
        ref = cache.lookup_turn(extend.parent_ref)
        if ref is None or ref.namespace != extend.namespace:
            raise UnknownParent(f"turn '{extend.parent_ref}' is not cached on this engine")
        prompt = list(ref.token_ids) + prompt
    if not prompt:
        raise InvalidRequest("the request has no tokens")
    ids = prompt + list(extend.resume_output_ids)
    if min(ids) < 0 or max(ids) >= cfg.vocab_size:
        raise InvalidRequest(f"token ids must be in [0, {cfg.vocab_size})")
    sampling = clamp_max_tokens(extend.sampling, len(prompt), context_len, pool_tokens)
    stop_ids = set(extend.sampling.stop_token_ids)
    if not extend.sampling.ignore_eos:
        stop_ids.update(tok.stop_token_ids)
    grammar = grammar_for(extend.constraint, stop_ids) if extend.constraint is not None else None
    req = Request(
        request_id=extend.request_id, namespace=extend.namespace, prompt_ids=prompt,
        params=sampling, stop_ids=frozenset(stop_ids),
        stopper=TextStopper(tok.stream_decoder(), sampling.stop),
        generator=make_generator(sampling), arrival_s=arrival_s,
        bind_turn_id=extend.bind_turn_id, session_id=extend.session_id, grammar=grammar,
        shared_len=extend.shared_prefix_len if extend.parent_ref is None else 0)
    replay_output(req, extend.resume_output_ids)
    return req


def context_len(model_len: int, max_context: int | None) -> int:
    """The longest sequence an engine serves: `max_context` (--max-context), at most the
    model's own `model_len` positions. Raises InvalidRequest for a value outside that."""
    if max_context is None:
        return model_len
    if not 1 <= max_context <= model_len:
        raise InvalidRequest(f"--max-context {max_context} is outside 1..{model_len}, the "
                             "model's context length")
    return max_context


def clamp_max_tokens(sampling: SamplingParams, prompt_len: int, context_len: int,
                     pool_tokens: int) -> SamplingParams:
    """`sampling` with max_tokens cut to the room left after the prompt (in the model context
    of `context_len` and a KV pool of `pool_tokens`), as hosted APIs do: the output then ends
    with finish reason "length". Raises RequestTooLong when not even one output token fits."""
    room = min(context_len, pool_tokens) - prompt_len
    if room < 1:
        where = (f"the context of {context_len} tokens (--max-context)"
                 if context_len <= prompt_len else
                 f"the KV pool ({pool_tokens} tokens); raise --kv-memory")
        raise RequestTooLong(f"the prompt's {prompt_len} tokens leave no room in {where}")
    if sampling.max_tokens <= room:
        return sampling
    return replace(sampling, max_tokens=room)


def replay_output(req: Request, output_ids: list[int]) -> None:
    """Replay an earlier attempt's output into `req` as if it had just been sampled (the grammar
    and the stop-string state advance; the text it makes was sent before). Raises
    InvalidRequest when that output could not have been generated under `req`'s limits."""
    if len(output_ids) >= req.params.max_tokens:
        raise InvalidRequest("resume_output_ids leave no room for max_tokens")
    for token_id in output_ids:
        if token_id in req.stop_ids or (req.grammar is not None
                                        and not req.grammar.accept_token(token_id)):
            raise InvalidRequest(f"resume_output_ids: token {token_id} cannot continue")
        req.output_ids.append(token_id)
        req.stopper.feed(token_id)
        if req.stopper.stopped:
            raise InvalidRequest("resume_output_ids already end with a stop string")


def finished_of(req: Request, now: float, worker_id: str = "") -> Finished:
    """The result of a request that ended at `now` (engine clock), with its timings."""
    first = req.first_token_s if req.first_token_s is not None else now
    scheduled = req.first_scheduled_s if req.first_scheduled_s is not None else now
    cached = req.first_cached_len or 0
    return Finished(
        request_id=req.request_id, finish_reason=req.finish_reason or "abort",
        output_token_ids=list(req.output_ids), text=req.stopper.final_text,
        prompt_len=len(req.prompt_ids), cached_len=cached,
        computed_len=len(req.prompt_ids) - cached, output_len=len(req.output_ids),
        timings=Timings(queue_s=scheduled - req.arrival_s, prefill_s=first - scheduled,
                        decode_s=now - first, ttft_s=first - req.arrival_s),
        stop_token_id=req.stop_token_id, num_drafted=req.num_drafted,
        num_accepted=req.num_accepted, worker_id=worker_id)
