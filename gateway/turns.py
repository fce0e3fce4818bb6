"""The turn service: one appended turn from new messages to a stored assistant turn.

    input turn  written first (move_branch=False), holding the rendered delta
    Extend      parent_ref = the engine ref of the parent assistant turn, token_ids = the delta;
                on `unknown_parent` (or no bound parent) the full token path from the ledger
    assistant   written under the input turn; the branch head fast-forwards to it

The engine binds each assistant turn under `engine_ref(input_turn_id)` (the store assigns the
assistant's id only when writing it, after generation). Branch heads are pinned in the engine.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from engine.protocol import Extend, Finished, Timings, TokenChunk
from engine.sampling_params import SamplingParams
from gateway.engine_link import EngineLink
from gateway.errors import EngineFailure, InvalidRequest
from gateway.rendering import TurnRenderer
from gateway.schemas import AppendTurnRequest, GenerateOptions
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


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class TurnEnded:
    turn: Turn
    branch: str | None
    timings: Timings | None = None  # the engine's, of the request that generated `turn`


TurnEvent = TurnStarted | TextDelta | TurnEnded


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
                       expected_version: int | None) -> AsyncGenerator[TurnEvent, None]:
        """TurnStarted, TextDelta*, TurnEnded. Raises session errors, InvalidRequest,
        EngineFailure / EngineUnavailable. Closing the iterator aborts the engine request."""
        params = self._sampling(request.generate)
        session = await self.store.get_session(session_id, tenant=tenant)
        target = await self._target(session, request)
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        delta = self._delta(session, target.parent, messages)
        (input_turn,) = await self.store.append_turns(
            session_id, tenant=tenant, turns=[NewTurn(role=_input_role(messages),
                                                      token_ids=delta, messages=messages)],
            branch=target.branch, parent_turn_id=target.parent.id,
            expected_version=expected_version, move_branch=False)
        yield TurnStarted(input_turn.id, target.parent.id)
        finished: Finished | None = None
        stream = self._generate(session, tenant, target.parent, input_turn, delta, params)
        async with aclosing(stream):  # closing this generator must reach the engine (Abort)
            async for event in stream:
                if isinstance(event, Finished):
                    finished = event
                else:
                    yield event
        assert finished is not None
        turn = await self._store_reply(session, tenant, target, input_turn, finished)
        await self._move_pins(target, input_turn.id)
        yield TurnEnded(turn, target.branch, finished.timings)

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

    def _delta(self, session: Session, parent: Turn, messages: list[dict[str, Any]]
               ) -> list[int]:
        system = session.system if isinstance(session.system, str) else None
        closer = ""
        if parent.role == "assistant":
            content = parent.messages[0].get("content", "") if parent.messages else ""
            closer = self.renderer.closer(str(content or ""), parent.token_ids)
        return self.renderer.input_token_ids(messages, system=system,
                                             after_root=parent.role == "root", closer=closer)

    async def _generate(self, session: Session, tenant: str, parent: Turn, input_turn: Turn,
                        delta: list[int], params: SamplingParams
                        ) -> AsyncGenerator[TextDelta | Finished, None]:
        ref = ref_of(parent)
        namespace = f"{tenant}:{session.model}"
        for attempt in range(2):
            if ref is None or attempt:
                ref, token_ids = None, await self.store.token_path(
                    session.id, input_turn.id, tenant=tenant)
            else:
                token_ids = delta
            extend = Extend(uuid.uuid4().hex, namespace, ref, token_ids, params,
                            bind_turn_id=engine_ref(input_turn.id), session_id=session.id)
            async with aclosing(self.engine.extend(extend)) as replies:
                async for message in replies:
                    if isinstance(message, TokenChunk):
                        if message.text:
                            yield TextDelta(message.text)
                    elif isinstance(message, Finished):
                        yield message
                        return
                    elif message.error_type != "unknown_parent" or ref is None:
                        raise EngineFailure(message.message, error_type=message.error_type)
        raise EngineFailure("the engine lost the parent twice", error_type="unknown_parent")

    async def _store_reply(self, session: Session, tenant: str, target: _Target,
                           input_turn: Turn, done: Finished) -> Turn:
        token_ids = list(done.output_token_ids)
        if done.stop_token_id is not None:
            token_ids.append(done.stop_token_id)
        usage = {"input_tokens": done.prompt_len, "cached_tokens": done.cached_len,
                 "computed_tokens": done.computed_len, "output_tokens": done.output_len}
        (turn,) = await self.store.append_turns(
            session.id, tenant=tenant, parent_turn_id=input_turn.id,
            turns=[NewTurn(role="assistant", token_ids=token_ids, usage=usage,
                           messages=[{"role": "assistant", "content": done.text}],
                           finish_reason=done.finish_reason)],
            branch=target.branch, move_branch=target.branch is not None,
            expected_head=target.old_head)
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


def _input_role(messages: list[dict[str, Any]]) -> Any:
    roles = {m["role"] for m in messages}
    if roles == {"tool"}:
        return "tool"
    if roles == {"system"}:
        return "system"
    return "user"
