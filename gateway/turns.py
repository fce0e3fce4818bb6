"""The turn service: one appended turn from new messages to a stored assistant turn.

    input turn  written first (move_branch=False), holding the rendered delta
    Extend      parent_ref = the engine ref of the parent assistant turn, token_ids = the delta;
                on `unknown_parent` (or no bound parent) the full token path from the ledger
    assistant   written under the input turn; the branch head fast-forwards to it

With tools on the session, the Extend carries the `tool_choice` grammar and the output is parsed
into text and tool-call events (`gateway.toolcall_parser`); the assistant turn stores the text
without markup and `tool_calls` (finish_reason "tool_calls" when it stopped after calls).

The engine binds each assistant turn under `engine_ref(input_turn_id)` (the store assigns the
assistant's id only when writing it, after generation). Branch heads are pinned in the engine.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from engine.constrained.spec import ToolConstraint
from engine.protocol import Finished, Timings
from engine.sampling_params import SamplingParams
from gateway.engine_link import EngineLink
from gateway.errors import InvalidRequest
from gateway.generation import GenerationSpec, Progress, TurnInterrupted, TurnResume, generate
from gateway.rendering import TurnRenderer
from gateway.schemas import AppendTurnRequest, GenerateOptions, NamedToolChoice
from gateway.store_retry import through_store_outage
from gateway.tool_prompt import ToolDef, normalize_tools, tool_constraint
from gateway.toolcall_parser import TextDelta as TextDelta
from gateway.toolcall_parser import ToolCallDelta, ToolCallEnd, ToolCallParser
from gateway.toolcall_parser import ToolCallStart as ToolCallStart
from sessions import BranchNotFound, HeadMoved, NewTurn, Session, SessionStore, Turn


def engine_ref(input_turn_id: str) -> str:
    """The engine's name for the assistant turn generated after `input_turn_id`."""
    return f"{input_turn_id}:reply"


def ref_of(turn: Turn) -> str | None:
    """Engine ref of a stored turn (only assistant turns are bound in the engine)."""
    return engine_ref(turn.parent_id) if turn.role == "assistant" and turn.parent_id else None


@dataclass(frozen=True)
class TurnStarted:
    input_turn_id: str
    parent_turn_id: str
    model: str | None = None  # the session's model name


@dataclass(frozen=True)
class TurnEnded:
    turn: Turn
    branch: str | None
    timings: Timings | None = None  # the engine's, of the request that generated `turn`
    finished: Finished | None = None  # the engine's result of that request
    finished_ns: int | None = None  # time.time_ns() when `finished` reached the gateway


TurnEvent = TurnStarted | TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd | TurnEnded


@dataclass(frozen=True)
class _Target:
    parent: Turn
    branch: str | None  # the branch that moves, None for an append under a non-head turn
    old_head: str | None


class TurnService:
    """Stateless beyond its collaborators; one per app."""

    def __init__(self, store: SessionStore, engine: EngineLink, renderer: TurnRenderer, *,
                 pin_ttl_s: float, max_tokens_limit: int) -> None:
        self.store = store
        self.engine = engine
        self.renderer = renderer
        self.pin_ttl_s = pin_ttl_s
        self.max_tokens_limit = max_tokens_limit

    async def run_turn(self, tenant: str, session_id: str, request: AppendTurnRequest, *,
                       expected_version: int | None, resume: TurnResume | None = None,
                       interruptible: bool = False) -> AsyncGenerator[TurnEvent, None]:
        """TurnStarted, (TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd)*, TurnEnded.

        With `resume` (an interrupted run of this same request) the stored input turn is reused
        and only the events after `resume.progress` follow TurnStarted. A worker lost mid-turn
        is waited for and the turn goes on (`gateway.generation`); with `interruptible` a loss
        after output was shown raises TurnInterrupted with the `resume` to continue from.
        Raises session errors, InvalidRequest, InvalidToolSchema, EngineFailure /
        EngineUnavailable. Closing the iterator aborts the engine request."""
        params = self._sampling(request.generate)
        session = await self.store.get_session(session_id, tenant=tenant)
        tools, constraint = _tooling(session, request.generate)
        if resume is None:
            target = await self._target(session, request)
            messages = [m.model_dump(exclude_none=True) for m in request.messages]
            delta = self._delta(session, target.parent, messages, tools)
            (input_turn,) = await self.store.append_turns(
                session_id, tenant=tenant, turns=[NewTurn(role=_input_role(messages),
                                                          token_ids=delta, messages=messages)],
                branch=target.branch, parent_turn_id=target.parent.id,
                expected_version=expected_version, move_branch=False)
            progress = Progress()
        else:
            parent = await self.store.get_turn(session_id, resume.parent_turn_id, tenant=tenant)
            target = _Target(parent, resume.branch, resume.old_head)
            input_turn = await self.store.get_turn(session_id, resume.input_turn_id,
                                                   tenant=tenant)
            delta, progress = list(input_turn.token_ids), resume.progress
        yield TurnStarted(input_turn.id, target.parent.id, session.model)
        parser = ToolCallParser() if constraint and constraint.mode != "none" else None
        if parser is not None and progress.text:
            parser.feed(progress.text)  # its events were shown by the interrupted run
        spec = GenerationSpec(
            f"{tenant}:{session.model}", ref_of(target.parent), delta, params,
            engine_ref(input_turn.id), session.id, constraint,
            lambda: through_store_outage(lambda: self.store.token_path(
                session.id, input_turn.id, tenant=tenant)))
        finished: Finished | None = None
        finished_ns: int | None = None
        stream = generate(self.engine, spec, parser, progress=progress,
                          interruptible=interruptible)
        try:
            async with aclosing(stream):  # closing this generator must reach the engine (Abort)
                async for event in stream:
                    if isinstance(event, Finished):
                        finished, finished_ns = event, time.time_ns()
                    else:
                        yield event
        except TurnInterrupted as exc:
            exc.resume = TurnResume(input_turn.id, target.parent.id, target.branch,
                                    target.old_head, exc.progress)
            raise
        assert finished is not None
        turn = await self._store_reply(session, tenant, target, input_turn, finished, parser)
        await self._move_pins(target, input_turn.id)
        yield TurnEnded(turn, target.branch, finished.timings, finished, finished_ns)

    async def rewind(self, tenant: str, session_id: str, branch: str, to_turn_id: str, *,
                     expected_version: int | None) -> Session:
        """Move `branch` back to `to_turn_id`; pin the new head, unpin the old one."""
        before = await self.store.get_session(session_id, tenant=tenant)
        after = await self.store.rewind(session_id, branch, to_turn_id, tenant=tenant,
                                        expected_version=expected_version)
        old = before.branches.get(branch)
        if old and old != to_turn_id:
            await self._unpin_turns(session_id, tenant, [old])
            await self._pin_turn(session_id, tenant, to_turn_id)
        return after

    async def delete(self, tenant: str, session_id: str) -> None:
        """Delete the session and drop the engine pins of its branch heads."""
        session = await self.store.get_session(session_id, tenant=tenant)
        await self._unpin_turns(session_id, tenant, list(set(session.branches.values())))
        await self.store.delete_session(session_id, tenant=tenant)

    # ---- internals ------------------------------------------------------------------------

    def _sampling(self, options: GenerateOptions) -> SamplingParams:
        if options.max_tokens > self.max_tokens_limit:
            raise InvalidRequest(f"generate.max_tokens must be <= {self.max_tokens_limit}")
        return SamplingParams(max_tokens=options.max_tokens, temperature=options.temperature,
                              top_p=options.top_p, top_k=options.top_k, seed=options.seed,
                              stop=tuple(options.stop))

    async def _target(self, session: Session, request: AppendTurnRequest) -> _Target:
        branch: str | None
        if request.parent_turn_id is None:
            branch = request.branch or session.default_branch
            if branch not in session.branches:
                raise BranchNotFound(session.id, branch)
            parent_id = session.branches[branch]
        else:
            parent_id = request.parent_turn_id
            branch = request.branch or next(
                (b for b, head in sorted(session.branches.items()) if head == parent_id), None)
        if branch is not None:
            head = session.branches.get(branch)
            if head is None:
                raise BranchNotFound(session.id, branch)
            if head != parent_id:
                raise HeadMoved(session.id, branch, head, session.version,
                                "parent_turn_id is not the branch head; fork a branch there")
        parent = await self.store.get_turn(session.id, parent_id, tenant=session.tenant)
        return _Target(parent, branch, session.branches.get(branch) if branch else None)

    def _delta(self, session: Session, parent: Turn, messages: list[dict[str, Any]],
               tools: Sequence[ToolDef]) -> list[int]:
        system = session.system if isinstance(session.system, str) else None
        closer = ""
        if parent.role == "assistant":
            content = parent.messages[0].get("content", "") if parent.messages else ""
            closer = self.renderer.closer(str(content or ""), parent.token_ids)
        return self.renderer.input_token_ids(messages, system=system,
                                             after_root=parent.role == "root", closer=closer,
                                             tools=tools)

    async def _store_reply(self, session: Session, tenant: str, target: _Target,
                           input_turn: Turn, done: Finished,
                           parser: ToolCallParser | None) -> Turn:
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
        usage = {"input_tokens": done.prompt_len, "cached_tokens": done.cached_len,
                 "computed_tokens": done.computed_len, "output_tokens": done.output_len}
        reply = NewTurn(role="assistant", token_ids=token_ids, usage=usage, messages=[message],
                        tool_calls=calls, finish_reason=finish_reason)
        # The generation is done: ride out a store restart rather than lose it. The write is
        # idempotent, so a retry after a reply lost with the connection cannot append twice.
        (turn,) = await through_store_outage(lambda: self.store.append_turns(
            session.id, tenant=tenant, parent_turn_id=input_turn.id, turns=[reply],
            branch=target.branch, move_branch=target.branch is not None,
            expected_head=target.old_head, idempotency_key=f"reply:{input_turn.id}"))
        return turn

    async def _move_pins(self, target: _Target, input_turn_id: str) -> None:
        if target.branch is None:
            return
        await self.engine.pin(engine_ref(input_turn_id), self.pin_ttl_s)
        old_ref = ref_of(target.parent) if target.old_head == target.parent.id else None
        if old_ref is not None:
            await self.engine.unpin(old_ref)

    async def _pin_turn(self, session_id: str, tenant: str, turn_id: str) -> None:
        turn = await self.store.get_turn(session_id, turn_id, tenant=tenant)
        ref = ref_of(turn)
        if ref is not None:
            await self.engine.pin(ref, self.pin_ttl_s)

    async def _unpin_turns(self, session_id: str, tenant: str, turn_ids: Sequence[str]) -> None:
        for turn_id in turn_ids:
            turn = await self.store.get_turn(session_id, turn_id, tenant=tenant)
            ref = ref_of(turn)
            if ref is not None:
                await self.engine.unpin(ref)


def _tooling(session: Session, options: GenerateOptions
             ) -> tuple[list[ToolDef], ToolConstraint | None]:
    """The session's tools and the grammar of `options.tool_choice`. Raises InvalidToolSchema
    and InvalidRequest (a choice the tools cannot satisfy)."""
    tools = normalize_tools(session.tools)
    choice = options.tool_choice
    if isinstance(choice, NamedToolChoice):
        return tools, tool_constraint(tools, {"name": choice.name})
    return tools, tool_constraint(tools, choice,
                                  enable_parallel_calls=options.parallel_tool_calls)


def _input_role(messages: list[dict[str, Any]]) -> Any:
    roles = {m["role"] for m in messages}
    if roles == {"tool"}:
        return "tool"
    if roles == {"system"}:
        return "system"
    return "user"
