"""Messages between the gateway and an engine worker (msgpack over ZeroMQ).

Plain frozen dataclasses: no torch, no pydantic. `encode`/`decode` turn them into msgpack bytes
tagged with the class name. Token ids cross as lists of ints.

Conversation of one request:  Extend → TokenChunk* → Finished | Failed.
`Failed(error_type="unknown_parent")` means the engine no longer holds the parent turn's KV:
resend with `parent_ref=None` and the full token path.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import msgpack

from engine.constrained.spec import ToolConstraint
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Extend:
    request_id: str
    namespace: str
    parent_ref: str | None  # a turn id bound earlier; None: token_ids is the full sequence
    token_ids: list[int]  # the delta after the parent's path, or the full sequence
    sampling: SamplingParams = field(default_factory=SamplingParams)
    bind_turn_id: str | None = None  # bind prompt + output to this turn id on finish
    session_id: str | None = None  # the session the request belongs to (drafting context)
    constraint: ToolConstraint | None = None  # tool-call grammar; None: unconstrained
    # Output an earlier attempt of this request already produced (its worker died): it follows
    # token_ids as output (counted in max_tokens, fed to stop strings and the grammar) and is
    # not sent again; Finished.output_token_ids and .text include it.
    resume_output_ids: list[int] = field(default_factory=list)
    # With parent_ref None: the first tokens of token_ids that are the operator's declared public
    # prefix (the gateway checked them). Its whole pages are shared across namespaces
    # (`engine.scheduler.shared_prefix`); everything after stays in `namespace`.
    shared_prefix_len: int = 0


@dataclass(frozen=True)
class TokenChunk:
    request_id: str
    token_ids: list[int]
    text: str
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass(frozen=True)
class Timings:
    queue_s: float = 0.0  # arrival to first scheduled step
    prefill_s: float = 0.0  # first scheduled step to first token
    decode_s: float = 0.0  # first token to finish
    ttft_s: float = 0.0  # arrival to first token


@dataclass(frozen=True)
class Finished:
    request_id: str
    finish_reason: str  # "stop" | "length" | "abort"
    output_token_ids: list[int]
    text: str
    prompt_len: int  # full sequence length the output continued
    cached_len: int  # tokens whose KV came from the prefix cache
    computed_len: int  # prompt tokens computed for this request (prompt_len - cached_len)
    output_len: int
    timings: Timings = field(default_factory=Timings)
    stop_token_id: int | None = None  # the stop token that ended generation, if any
    num_drafted: int = 0
    num_accepted: int = 0
    worker_id: str = ""  # the engine that produced it (Stats.worker_id): where its KV now is


@dataclass(frozen=True)
class Failed:
    request_id: str
    error_type: str  # engine.errors.*.error_type, e.g. "unknown_parent", "request_too_long"
    message: str


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Pin:
    turn_id: str
    ttl_s: float


@dataclass(frozen=True)
class Unpin:
    turn_id: str


@dataclass(frozen=True)
class PrefixProbe:
    """How much of `token_ids` this engine holds cached (the gateway routes a turn whose
    parent's worker is unknown to the one holding the longest prefix). Read-only."""

    request_id: str
    namespace: str
    token_ids: list[int]
    # The prompt tokens a turn would compute here when the gateway knows it (its parent's KV
    # is bound on this worker: the delta); -1: those of `token_ids` that are not cached.
    num_new_tokens: int = -1
    # Load shedding: the caller's bound on the wait; a turn estimated within it has its tokens
    # reserved until a request binding `reserve_for` arrives (0: nothing reserved).
    max_wait_s: float = 0.0
    reserve_for: str = ""


@dataclass(frozen=True)
class PrefixMatch:
    request_id: str
    cached_len: int  # tokens of the probe's prefix whose KV is cached (whole pages)
    num_running: int
    num_waiting: int
    worker_id: str
    queue_wait_s: float = 0.0  # estimated wait for the probed turn's first token (shedding)


@dataclass(frozen=True)
class StatsRequest:
    request_id: str


@dataclass(frozen=True)
class Stats:
    request_id: str
    num_running: int
    num_waiting: int
    num_pages: int
    num_free_pages: int
    num_cached_pages: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_finished: int
    model: str
    page_size: int
    num_drafted: int = 0  # draft tokens proposed / accepted since the engine started
    num_accepted: int = 0
    vocab_hash: str = ""  # Tokenizer.vocab_hash of the served model (the gateway checks it)
    num_locked_pages: int = 0  # cached pages that running requests hold (not evictable)
    num_pins: int = 0  # branch heads pinned by the gateway
    worker_id: str = ""  # random per engine instance: a restarted worker is a new one
    num_host_restored_pages: int = 0  # pages loaded back from the host KV tier, not recomputed
    num_kv_peers: int = 0  # prefill workers this one has a formed KV pair with
    num_kv_sent_pages: int = 0  # disaggregation: pages this worker prefilled for decode workers
    num_kv_received_pages: int = 0  # pages received from prefill workers
    num_kv_failed_transfers: int = 0  # transfers that failed either side (their KV recomputed)
    num_kv_fallbacks: int = 0  # parked requests that ran without their transfer
    context_len: int = 0  # the longest prompt plus output the engine serves (0: not said)

    @property
    def num_held_pages(self) -> int:
        """Pages that are neither free nor evictable cache: held by requests in flight."""
        return (self.num_pages - self.num_free_pages - self.num_cached_pages
                + self.num_locked_pages)

    @property
    def hit_rate(self) -> float:
        if not self.prefix_query_tokens:
            return 0.0
        return self.prefix_hit_tokens / self.prefix_query_tokens


@dataclass(frozen=True)
class KvConnect:
    """A decode worker asks a prefill worker to form a KV pair (engine.disagg) under a key it
    never used before (its worker id and a generation)."""

    decode_key: str
    fingerprint: str  # model, KV dtype and page shape: pages only cross between equal ones


@dataclass(frozen=True)
class KvAccept:
    decode_key: str
    store_host: str  # the prefill worker's TCPStore, where the pair's gloo group meets
    store_port: int
    error: str = ""  # why the pair is refused (prefix cache off, another model)


@dataclass(frozen=True)
class PrefillFor:
    """Compute the KV of `token_ids` (whole pages) and send pages `first_page..` over the pair
    `decode_key` as transfer `tag` (a failed one is sent as a failure header)."""

    decode_key: str
    tag: int
    namespace: str
    token_ids: list[int]
    first_page: int


Message = (Extend | TokenChunk | Finished | Failed | Abort | Pin | Unpin | StatsRequest | Stats
           | PrefixProbe | PrefixMatch | KvConnect | KvAccept | PrefillFor)
MESSAGE_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (Extend, TokenChunk, Finished, Failed, Abort, Pin, Unpin, StatsRequest, Stats,
                PrefixProbe, PrefixMatch, KvConnect, KvAccept, PrefillFor)
}


def encode(message: Message) -> bytes:
    # A shallow dict: `asdict` would deep-copy every token list on the hot path.
    body = {f.name: getattr(message, f.name) for f in fields(message)}
    if isinstance(message, Finished):
        body["timings"] = asdict(message.timings)
    if isinstance(message, Extend):
        body["sampling"] = message.sampling.to_dict()
        body["constraint"] = message.constraint.to_dict() if message.constraint else None
    body["type"] = type(message).__name__
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def decode(data: bytes) -> Message:
    """Raises ValueError on an unknown or malformed message."""
    body = msgpack.unpackb(data, raw=False)
    if not isinstance(body, dict) or body.get("type") not in MESSAGE_TYPES:
        raise ValueError(f"not an engine message: {str(body)[:100]}")
    cls = MESSAGE_TYPES[body.pop("type")]
    if cls is Extend:
        body["sampling"] = SamplingParams.from_dict(body["sampling"])
        if body.get("constraint") is not None:
            body["constraint"] = ToolConstraint.from_dict(body["constraint"])
    if cls is Finished:
        body["timings"] = Timings(**body["timings"])
    names = {f.name for f in fields(cls)}
    message: Message = cls(**{k: v for k, v in body.items() if k in names})
    return message
