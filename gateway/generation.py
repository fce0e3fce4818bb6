"""One turn's generation on the engine, carried across engine-worker restarts.

    attempt 1   Extend(parent_ref, delta)            the parent's KV is on the worker (sent
                                                     by the caller before it answers its client)
    unknown     Extend(None, full path)              the worker no longer holds the parent
    worker lost Extend(None, full path, resume_output_ids=output so far)  on the new worker

A worker that dies mid-turn (its requests fail with `engine_shutdown`) is replaced by the
supervisor; the turn then continues on the new worker from the ledger's token path plus the
output it had produced, so the result is what one uninterrupted run gives (greedy: the same
tokens). With `interruptible` (a stream that has already shown output to its client) the loss
is raised as TurnInterrupted instead, carrying that output, so a retry can continue the turn.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from engine.client import ReplyStream
from engine.constrained.spec import ToolConstraint
from engine.protocol import Extend, Failed, Finished, TokenChunk
from engine.sampling_params import SamplingParams
from gateway.cache_scope import SharedPrefix
from gateway.engine_link import EngineLink
from gateway.engine_pool import EnginePool
from gateway.errors import ApiError, EngineFailure
from gateway.toolcall_parser import ParseEvent, ToolCallParser
from gateway.toolcall_parser import TextDelta as TextDelta
from sessions import NewTurn

MAX_WORKER_LOSSES = 2  # a turn that kills its worker this often is not run a third time


@dataclass(frozen=True)
class Progress:
    """What a turn's generation has produced so far (token ids and the text they decode to,
    before tool-call parsing)."""

    output_ids: tuple[int, ...] = ()
    text: str = ""


@dataclass(frozen=True)
class TurnResume:
    """An interrupted turn of a request: its ids (chosen before generation; nothing is stored
    yet), its place (parent, branch and the branch's lease), its rendered input and what its
    generation had produced. Plain data, kept under the request's Idempotency-Key."""

    input_turn_id: str
    reply_turn_id: str
    parent_turn_id: str
    branch: str | None
    lease_id: str
    delta: tuple[int, ...]
    progress: Progress

    def to_dict(self) -> dict[str, Any]:
        return {"input_turn_id": self.input_turn_id, "reply_turn_id": self.reply_turn_id,
                "parent_turn_id": self.parent_turn_id, "branch": self.branch,
                "lease_id": self.lease_id, "delta": list(self.delta),
                "output_ids": list(self.progress.output_ids), "text": self.progress.text}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TurnResume:
        return cls(data["input_turn_id"], data["reply_turn_id"], data["parent_turn_id"],
                   data["branch"], data["lease_id"], tuple(data["delta"]),
                   Progress(tuple(data["output_ids"]), data["text"]))


class TurnInterrupted(ApiError):
    """The engine worker died while a stream was showing output; a retry with the same
    Idempotency-Key continues the turn. `progress` is what was produced; `resume` (set by the
    turn service) is everything a retry needs to continue it."""

    error_type = "turn_interrupted"

    def __init__(self, message: str, progress: Progress) -> None:
        super().__init__(message)
        self.progress = progress
        self.resume: TurnResume | None = None


@dataclass(frozen=True)
class GenerationSpec:
    """Everything one turn's Extend needs. `full_path()` reads the ledger's token path up to and
    including the input turn (used when the engine lacks the parent)."""

    namespace: str
    parent_ref: str | None
    delta: list[int]
    params: SamplingParams
    bind_ref: str
    session_id: str
    constraint: ToolConstraint | None
    full_path: Callable[[], Awaitable[list[int]]]
    shared: SharedPrefix = SharedPrefix()  # the operator's public prefix (gateway.cache_scope)


async def first_extend(spec: GenerationSpec, progress: Progress) -> Extend:
    """The Extend of a turn's first attempt: the delta after the parent's bound KV, or the full
    path when there is no bound parent or output to resume."""
    ref = None if progress.output_ids else spec.parent_ref
    token_ids = spec.delta if ref is not None else await spec.full_path()
    return _extend(spec, ref, token_ids, progress)


def _extend(spec: GenerationSpec, ref: str | None, token_ids: list[int],
            progress: Progress) -> Extend:
    # Only a full path is checked against the public prefix: a delta's start is not the path's.
    shared_len = spec.shared.shared_len(token_ids) if ref is None else 0
    return Extend(uuid.uuid4().hex, spec.namespace, ref, token_ids, spec.params,
                  bind_turn_id=spec.bind_ref, session_id=spec.session_id,
                  constraint=spec.constraint, resume_output_ids=list(progress.output_ids),
                  shared_prefix_len=shared_len)


async def generate(pool: EnginePool, spec: GenerationSpec, parser: ToolCallParser | None, *,
                   started: tuple[EngineLink, Extend, ReplyStream],
                   progress: Progress = Progress(), interruptible: bool = False
                   ) -> AsyncGenerator[ParseEvent | Finished, None]:
    """Parse events of the output after `progress`, then the engine's Finished (whose output
    and text include `progress`). `started` is the first attempt, already sent on a worker of
    `pool` (`first_extend` and `EngineLink.start`), so the engine works while the caller answers
    its client. A lost worker's turn goes on on another worker that is up, else on the
    restarted one.
    Raises EngineFailure, EngineUnavailable, TurnInterrupted. Closing the generator aborts the
    engine request."""
    link, extend, replies = started
    num_losses = 0
    shown = False  # an event of this call reached the caller
    while True:
        failure: Failed | None = None
        try:
            async for message in link.follow(replies):
                if isinstance(message, TokenChunk):
                    progress = replace(progress, text=progress.text + message.text,
                                       output_ids=progress.output_ids + tuple(message.token_ids))
                    for event in _parse(parser, message.text):
                        shown = True
                        yield event
                elif isinstance(message, Finished):
                    for event in parser.finish() if parser else []:
                        yield event
                    yield message
                    return
                else:
                    failure = message
                    break
        finally:
            await replies.aclose()
        assert failure is not None
        if failure.error_type == "unknown_parent" and extend.parent_ref is not None:
            pass  # the worker no longer holds the parent: the full path
        elif (failure.error_type == "engine_shutdown" and num_losses < MAX_WORKER_LOSSES
              and ((other := pool.failover(link)) is not None or link.is_supervised)):
            num_losses += 1
            link = other or link
            if interruptible and shown:
                raise TurnInterrupted("the engine worker restarted during this turn; retry with "
                                      "the same Idempotency-Key to continue it", progress)
            # the new worker holds nothing: the ledger's path plus the output so far
        else:
            raise EngineFailure(failure.message, error_type=failure.error_type)
        extend = _extend(spec, None, await spec.full_path(), progress)
        replies = await link.start(extend)


def read_once(read: Callable[[], Awaitable[list[int]]]) -> Callable[[], Awaitable[list[int]]]:
    """`read`, called at most once (the ledger's path does not change under a turn)."""
    memo: list[list[int]] = []

    async def once() -> list[int]:
        if not memo:
            memo.append(await read())
        return memo[0]
    return once


def _parse(parser: ToolCallParser | None, text: str) -> list[ParseEvent]:
    if not text:
        return []
    return parser.feed(text) if parser else [TextDelta(text)]


def reply_turn(done: Finished, parser: ToolCallParser | None) -> NewTurn:
    """The assistant turn a finished generation stores: its tokens (with the stop token, so
    the next turn's prefix is what the engine cached), text, tool calls and usage."""
    token_ids = list(done.output_token_ids)
    if done.stop_token_id is not None:
        token_ids.append(done.stop_token_id)
    calls = [c.to_dict() for c in parser.tool_calls] if parser else []
    message: dict[str, Any] = {"role": "assistant",
                               "content": parser.text if parser else done.text}
    if calls:
        message["tool_calls"] = calls
    finish_reason = "tool_calls" if calls and done.finish_reason == "stop" else (
        done.finish_reason)
    timings = done.timings
    usage = {"input_tokens": done.prompt_len, "cached_tokens": done.cached_len,
             "computed_tokens": done.computed_len, "output_tokens": done.output_len,
             # What the session-tree view shows per turn (`gateway.tree_views`).
             "ttft_ms": round(timings.ttft_s * 1000, 2),
             "queue_ms": round(timings.queue_s * 1000, 2),
             "decode_ms": round(timings.decode_s * 1000, 2),
             "drafted_tokens": done.num_drafted, "accepted_tokens": done.num_accepted}
    return NewTurn(role="assistant", token_ids=token_ids, usage=usage, messages=[message],
                   tool_calls=calls, finish_reason=finish_reason, worker=done.worker_id or None)
