"""The turn service: one appended turn from new messages to a committed assistant turn.

    begin       one store script: the parent (default: the branch head), If-Match, the head
                check and a lease on the branch (409 before anything runs); ids for the input
                and the reply turn are chosen here
    route       the worker that generated the parent, else the one caching the longest prefix
                of the path, else the least loaded (`gateway.engine_pool`)
    Extend      parent_ref = the parent assistant turn's id (the engine binds each reply under
                its own turn id), token_ids = the rendered delta; the full path when the engine
                lacks the parent (the root's tokens are at hand, deeper paths are read)
    commit      one store script: input and reply appended as a chain, the head moved, the
                lease released; nothing is stored before it, so a failed turn leaves nothing

With tools on the session, the Extend carries the `tool_choice` grammar and the output is parsed
into text and tool-call events (`gateway.toolcall_parser`); the assistant turn stores the text
without markup and `tool_calls` (finish_reason "tool_calls" when it stopped after calls).
`generate.response_format` adds the JSON answer's schema to that grammar, and its instruction to
the delta (`gateway.response_format`; checked before the branch is reserved).
Branch heads are pinned in the engine.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from engine.protocol import Finished, Timings
from engine.sampling_params import SamplingParams
from gateway.cache_scope import SharedPrefix, cache_namespace
from gateway.engine_pool import EnginePool
from gateway.errors import InvalidRequest
from gateway.generation import (
    GenerationSpec,
    Progress,
    TurnInterrupted,
    TurnResume,
    first_extend,
    generate,
    read_once,
    reply_turn,
)
from gateway.leases import LeaseKeeper
from gateway.output_parser import parser_for
from gateway.rendering import TurnRenderer
from gateway.response_format import format_note, normalize_response_format
from gateway.schemas import AppendTurnRequest, GenerateOptions
from gateway.shedding import Shedder
from gateway.store_retry import through_store_outage
from gateway.tool_prompt import ToolDef
from gateway.toolcall_parser import TextDelta as TextDelta
from gateway.toolcall_parser import ToolCallDelta, ToolCallEnd, ToolCallParser
from gateway.toolcall_parser import ToolCallStart as ToolCallStart
from gateway.toolsets import Toolsets
from sessions import NewTurn, Session, SessionStore, Turn
from sessions.keys import new_id
from sessions.turn_commit import TurnStart


def ref_of(turn: Turn) -> str | None:
    """Engine ref of a stored turn: assistant turns are bound under their own id."""
    return turn.id if turn.role == "assistant" else None


@dataclass(frozen=True)
class TurnStarted:
    input_turn_id: str  # chosen before generation; stored with the reply at commit
    parent_turn_id: str
    model: str | None = None  # the session's model name
    branch: str | None = None  # the branch the reply will move (None: none)
    session_id: str = ""


@dataclass(frozen=True)
class TurnEnded:
    turn: Turn
    branch: str | None
    timings: Timings | None = None  # the engine's, of the request that generated `turn`
    finished: Finished | None = None  # the engine's result of that request
    finished_ns: int | None = None  # time.time_ns() when `finished` reached the gateway


TurnEvent = TurnStarted | TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd | TurnEnded


class TurnService:
    """Stateless beyond its collaborators; one per app."""

    def __init__(self, store: SessionStore, engine: EnginePool, renderer: TurnRenderer, *,
                 pin_ttl_s: float, max_tokens_limit: int, model_id: str,
                 shared_prefix: SharedPrefix | None = None,
                 max_queue_wait_s: float | None = None) -> None:
        self.store = store
        self.engine = engine
        self.renderer = renderer
        self.pin_ttl_s = pin_ttl_s
        self.max_tokens_limit = max_tokens_limit
        self.model_id = model_id  # the served model: part of the engine cache's namespace
        self.shared_prefix = shared_prefix or SharedPrefix()  # gateway.cache_scope
        self.shedder = Shedder(max_queue_wait_s)  # load shedding (`gateway.shedding`)
        self.toolsets = Toolsets()
        self.leases = LeaseKeeper(store)

    async def run_turn(self, tenant: str, session_id: str, request: AppendTurnRequest, *,
                       expected_version: int | None, resume: TurnResume | None = None,
                       interruptible: bool = False, start: TurnStart | None = None,
                       fork_on_conflict: bool = False, idempotency_key: str | None = None,
                       request_hash: str | None = None) -> AsyncGenerator[TurnEvent, None]:
        """TurnStarted, (TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd)*, TurnEnded.

        The branch is reserved first (`start`, when the caller already did); with
        `fork_on_conflict` a busy or moved head forks a branch instead of raising (the
        compatible routes). With `resume` (an interrupted run of this same request) its ids are
        reused and only the events after `resume.progress` follow TurnStarted. A worker lost
        mid-turn is waited for and the turn goes on (`gateway.generation`); with
        `interruptible` a loss after output was shown raises TurnInterrupted carrying the
        `resume`. `idempotency_key` + `request_hash` make the commit idempotent.
        Raises session errors (HeadMoved, BranchBusy, VersionConflict, ... before any output),
        InvalidRequest, InvalidToolSchema, EngineFailure / EngineUnavailable. Closing the
        iterator aborts the engine request and releases the branch."""
        began_s = time.monotonic()
        params = self._sampling(request.generate)
        fmt = normalize_response_format(request.generate.response_format,
                                        param="generate.response_format")
        lease_id = resume.lease_id if resume else new_id()
        if start is None:
            start = await self.leases.begin(
                session_id, tenant=tenant, lease_id=lease_id,
                branch=resume.branch if resume else request.branch,
                parent_turn_id=resume.parent_turn_id if resume else request.parent_turn_id,
                expected_version=None if resume else expected_version,
                fork_branch=_fork_name() if fork_on_conflict or resume else None)
        session, parent = start.session, start.parent
        try:
            tools, constraint = self.toolsets.for_turn(session.tools, request.generate, fmt)
            messages = [m.model_dump(exclude_none=True) for m in request.messages]
            if resume is None:
                input_id, reply_id = new_id(), new_id()
                note = format_note(fmt, constraint)
                delta, progress = self._delta(session, parent, messages, tools, note), Progress()
            else:
                input_id, reply_id = resume.input_turn_id, resume.reply_turn_id
                delta, progress = list(resume.delta), resume.progress
        except BaseException:
            await self._release(start)
            raise
        parser = parser_for(constraint)
        if parser is not None and progress.text:
            parser.feed(progress.text)  # its events were shown by the interrupted run
        namespace = cache_namespace(self.model_id, tenant, request.cache_salt)
        full_path = read_once(lambda: self._full_path(session.id, tenant, parent, delta))
        try:  # sent before the client hears of the turn: the engine starts at once
            route = await self.engine.route(parent.worker, lambda: _with(namespace, full_path()))
            # the parent's KV is where it was generated (or, unrecorded, maybe anywhere)
            ref = ref_of(parent) if parent.worker in (None, route.link.worker_id) else None
            predicted = None if progress.output_ids else await self.shedder.check(
                route, namespace, len(delta) if ref is not None else None, full_path,
                reply_id, began_s)
            spec = GenerationSpec(namespace, ref, delta, params, reply_id, session.id,
                                  constraint, full_path, self.shared_prefix)
            extend = await first_extend(spec, progress)
            replies = await route.link.start(extend)
        except BaseException:
            await self._release(start)
            raise
        try:
            yield TurnStarted(input_id, parent.id, session.model, start.branch, session.id)
        except BaseException:
            await replies.aclose()
            await self._release(start)
            raise
        finished: Finished | None = None
        finished_ns: int | None = None
        kept = False  # the lease outlives this call (an interrupted stream continues later)
        committed = False  # the commit released the lease
        try:
            with self.leases.renewing(start):
                stream = generate(self.engine, spec, parser,
                                  started=(route.link, extend, replies), progress=progress,
                                  interruptible=interruptible)
                async with aclosing(stream):  # closing must reach the engine (Abort)
                    async for event in stream:
                        if isinstance(event, Finished):
                            finished, finished_ns = event, time.time_ns()
                            self.shedder.observe(route, predicted, began_s, event)
                        else:
                            yield event
                assert finished is not None
                input_turn = NewTurn(role=_input_role(messages), token_ids=delta,
                                     messages=messages)
                turn, branch = await self._commit(start, tenant, input_id, input_turn,
                                                  reply_id, finished, parser, idempotency_key,
                                                  request_hash)
                committed = True
        except TurnInterrupted as exc:
            kept = True
            exc.resume = TurnResume(input_id, reply_id, parent.id, start.branch, lease_id,
                                    tuple(delta), exc.progress)
            raise
        finally:
            if not committed and not kept:
                await self._release(start)
        await self._move_pins(start, branch, parent, turn)
        yield TurnEnded(turn, branch, finished.timings, finished, finished_ns)

    async def rewind(self, tenant: str, session_id: str, branch: str, to_turn_id: str, *,
                     expected_version: int | None) -> Session:
        """Move `branch` back to `to_turn_id`; pin the new head, unpin the old one."""
        before = await self.store.get_session(session_id, tenant=tenant)
        after = await self.store.rewind(session_id, branch, to_turn_id, tenant=tenant,
                                        expected_version=expected_version)
        old = before.branches.get(branch)
        if old and old != to_turn_id:
            await self.engine.unpin(None, old)
            await self.engine.pin(None, to_turn_id, self.pin_ttl_s)  # a no-op where unbound
        return after

    async def delete(self, tenant: str, session_id: str) -> None:
        """Delete the session and drop the engine pins of its branch heads."""
        session = await self.store.get_session(session_id, tenant=tenant)
        for head in set(session.branches.values()):
            await self.engine.unpin(None, head)
        await self.store.delete_session(session_id, tenant=tenant)

    # ---- internals ------------------------------------------------------------------------

    def _sampling(self, options: GenerateOptions) -> SamplingParams:
        if options.max_tokens > self.max_tokens_limit:
            raise InvalidRequest(f"generate.max_tokens must be <= {self.max_tokens_limit}")
        return SamplingParams(max_tokens=options.max_tokens, temperature=options.temperature,
                              top_p=options.top_p, top_k=options.top_k, seed=options.seed,
                              stop=tuple(options.stop))

    def _delta(self, session: Session, parent: Turn, messages: list[dict[str, Any]],
               tools: Sequence[ToolDef], note: str | None) -> list[int]:
        system = session.system if isinstance(session.system, str) else None
        closer = ""
        if parent.role == "assistant":
            content = parent.messages[0].get("content", "") if parent.messages else ""
            closer = self.renderer.closer(str(content or ""), parent.token_ids)
        return self.renderer.input_token_ids(messages, system=system,
                                             after_root=parent.role == "root", closer=closer,
                                             tools=tools, note=note)

    async def _full_path(self, session_id: str, tenant: str, parent: Turn,
                         delta: list[int]) -> list[int]:
        """The whole prompt: the ledger's path to the parent, then the delta."""
        if parent.role == "root":
            return [*parent.token_ids, *delta]
        path = await through_store_outage(
            lambda: self.store.token_path(session_id, parent.id, tenant=tenant))
        return [*path, *delta]

    async def _commit(self, start: TurnStart, tenant: str, input_id: str, input_turn: NewTurn,
                      reply_id: str, done: Finished, parser: ToolCallParser | None,
                      idempotency_key: str | None, request_hash: str | None
                      ) -> tuple[Turn, str | None]:
        reply = reply_turn(done, parser)
        fields = {"request": request_hash} if request_hash else None
        # The generation is done: ride out a store restart rather than lose it. A repeat after
        # a reply lost with the connection is answered from the idempotency record (with a
        # key), else refused for the ids it finds already written (never appended twice).
        turns, branch = await through_store_outage(lambda: self.store.turns.commit_turn(
            start, tenant=tenant, turns=[(input_id, input_turn), (reply_id, reply)],
            fork_branch=_fork_name(start.branch), idempotency_key=idempotency_key,
            request_fields=fields))
        return turns[-1], branch

    async def _move_pins(self, start: TurnStart, branch: str | None, parent: Turn,
                         reply: Turn) -> None:
        if branch is None:
            return
        await self.engine.pin(reply.worker, reply.id, self.pin_ttl_s)
        if branch == start.branch and not start.forked and ref_of(parent) is not None:
            await self.engine.unpin(parent.worker, parent.id)  # no branch's head now

    async def _release(self, start: TurnStart) -> None:
        await self.leases.release(start)  # never raises; retried when the store is down


async def _with(namespace: str, path: Awaitable[list[int]]) -> tuple[str, list[int]]:
    return namespace, await path


def _fork_name(base: str | None = None) -> str:
    """A fresh name for a branch the caller did not name."""
    return f"{base}-{secrets.token_hex(3)}" if base else f"compat-{secrets.token_hex(4)}"


def _input_role(messages: list[dict[str, Any]]) -> Any:
    roles = {m["role"] for m in messages}
    if roles == {"tool"}:
        return "tool"
    if roles == {"system"}:
        return "system"
    return "user"
