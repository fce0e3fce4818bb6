"""One compatible request as a native turn: resolve the model, place the conversation in the tree,
append the new messages through `TurnService`, and index the reply once it is stored.

Generation options are mapped leniently where the APIs differ from the native limits: a
`max_tokens` above `settings.max_tokens_limit` is capped (agents ask for 32k as a matter of
course), while options the engine cannot honour are a 400 in the API's own envelope.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request
from pydantic import ValidationError

from gateway.auth import Principal
from gateway.compat.conversation import Conversation, ToolChoice
from gateway.compat.placement import Placement, TreeMapper
from gateway.errors import InvalidRequest, UnknownModel
from gateway.rate_limits import Admission, RateLimiter
from gateway.schemas import AppendTurnRequest, GenerateOptions, Message, NamedToolChoice
from gateway.schemas import ToolChoice as NativeToolChoice
from gateway.settings import GatewaySettings
from gateway.telemetry import Telemetry, traced_turn
from gateway.turns import TurnEnded, TurnEvent, TurnService, TurnStarted
from sessions import SessionNotFound, TurnNotFound, path_hashes

SESSION_HEADER = "x-radixgate-session-id"
TURN_HEADER = "x-radixgate-turn-id"
MAX_STOP = 16


@dataclass(frozen=True)
class StartedTurn:
    """A turn whose branch is reserved and whose generation is about to start. `events` yields
    the rest of the turn (TextDelta ... TurnEnded); closing it aborts the engine request."""

    placement: Placement
    started: TurnStarted
    events: AsyncGenerator[TurnEvent, None]

    @property
    def headers(self) -> dict[str, str]:
        """Response headers naming the session and the input turn."""
        return {SESSION_HEADER: self.placement.session_id,
                "x-radixgate-input-turn-id": self.started.input_turn_id,
                "x-radixgate-branch": self.started.branch or ""}


class CompatService:
    """Built per request from the app state; holds no state of its own."""

    def __init__(self, turns: TurnService, settings: GatewaySettings, model: str,
                 telemetry: Telemetry, limiter: RateLimiter) -> None:
        self.turns = turns
        self.settings = settings
        self.model = model
        self.telemetry = telemetry
        self.limiter = limiter
        self.mapper = TreeMapper(turns.store, turns.renderer, model)
        self.admission: Admission | None = None  # this request's, once `admit` passed

    async def admit(self, principal: Principal, max_tokens: int | None) -> Admission:
        """Admit this request under its limits (429 RateLimited), reserving `max_tokens`
        (None: the cap) of output; the turn `start` begins settles it when it ends."""
        cap = self.settings.max_tokens_limit
        self.admission = await self.limiter.admit(principal, min(max_tokens or cap, cap))
        return self.admission

    def check_model(self, requested: str) -> None:
        """Raise UnknownModel (404) unless `requested` is served or an alias of it."""
        if self.settings.resolve_model(requested, self.model) != self.model:
            raise UnknownModel(f"model {requested!r} is not served here (this gateway serves "
                               f"{self.model!r} and the aliases in RADIXGATE_MODEL_ALIASES)")

    def count_tokens(self, conversation: Conversation) -> int:
        """Prompt tokens of the conversation as a new session would hold them (no I/O)."""
        renderer = self.turns.renderer
        tools = self.turns.toolsets.of(conversation.tools)
        system_ids = renderer.system_token_ids(conversation.system, tools)
        delta = renderer.input_token_ids(conversation.messages, system=conversation.system,
                                         after_root=True, tools=tools)
        return len(system_ids) + len(delta)

    async def start(self, tenant: str, conversation: Conversation, *,
                    session_hint: str | None) -> StartedTurn:
        """Place the conversation and reserve its branch (three store round trips with the
        key check: the index, then the turn's start or the new session). Raises UnknownModel,
        InvalidRequest and session / engine errors before anything streams."""
        self.check_model(conversation.model)
        tools = self.turns.toolsets.of(conversation.tools)  # InvalidToolSchema before any I/O
        request = self._append_request(conversation)  # every message validated, once
        for placement in await self.mapper.candidates(tenant, conversation,
                                                      session_hint=session_hint):
            try:
                return await self._run(tenant, placement, request)
            except (SessionNotFound, TurnNotFound):
                continue  # a tenant-wide entry naming a turn that is gone: try the next
        placement = await self.mapper.create(tenant, conversation, tools,
                                             session_hint=session_hint)
        return await self._run(tenant, placement, request)

    async def start_after(self, tenant: str, conversation: Conversation, *, session_id: str,
                          parent_turn_id: str, parent_path_hash: str) -> StartedTurn:
        """Append all of the conversation's messages under a known turn (the reply a client
        continues by id: `previous_response_id`), forking when that turn already has children.
        `parent_path_hash`: the path hash of the conversation through the parent, so the reply
        is indexed for later full resends. The session's own system prompt and tools apply: the
        caller checks they are the conversation's. Raises as `start`."""
        self.check_model(conversation.model)
        conversation.check_answerable()
        self.turns.toolsets.of(conversation.tools)
        request = self._append_request(conversation)
        hashes = path_hashes(parent_path_hash, conversation.messages)
        placement = Placement(session_id, parent_turn_id, conversation.messages, tuple(hashes), 0)
        return await self._run(tenant, placement, request)

    async def _run(self, tenant: str, placement: Placement,
                   request: AppendTurnRequest) -> StartedTurn:
        request = request.model_copy(update={
            "parent_turn_id": placement.parent_turn_id,
            "messages": request.messages[placement.num_matched:]})
        events = traced_turn(self.telemetry, self.turns.run_turn(
            tenant, placement.session_id, request, expected_version=None,
            start=placement.start, fork_on_conflict=True),
            model=self.model, session_id=placement.session_id,
            max_tokens=request.generate.max_tokens)
        try:
            first = await anext(events)
        except BaseException:
            await events.aclose()
            raise
        assert isinstance(first, TurnStarted)
        indexed = self._indexed(tenant, placement, events)
        if self.admission is not None:
            indexed = self.admission.watch(indexed)
        return StartedTurn(placement, first, indexed)

    def _append_request(self, conversation: Conversation) -> AppendTurnRequest:
        gen = conversation.generation
        if len(gen.stop) > MAX_STOP:
            raise InvalidRequest(f"at most {MAX_STOP} stop sequences are supported")
        try:
            options = GenerateOptions(
                max_tokens=min(gen.max_tokens, self.settings.max_tokens_limit),
                temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k, seed=gen.seed,
                stop=list(gen.stop), tool_choice=_native_choice(gen.tool_choice),
                parallel_tool_calls=gen.parallel_tool_calls,
                response_format=None if gen.response_format is None else dict(
                    gen.response_format))
            return AppendTurnRequest(messages=[Message.model_validate(m)
                                               for m in conversation.messages],
                                     generate=options, cache_salt=conversation.cache_salt)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise InvalidRequest(f"{where}: {first.get('msg')}") from exc

    async def _indexed(self, tenant: str, placement: Placement,
                       events: AsyncGenerator[TurnEvent, None]
                       ) -> AsyncGenerator[TurnEvent, None]:
        async with aclosing(events):
            async for event in events:
                if isinstance(event, TurnEnded):
                    # Before the client sees the end: its next request must find this turn.
                    await self.mapper.record_reply(tenant, placement, event.turn)
                yield event


def _native_choice(choice: ToolChoice | None) -> NativeToolChoice | None:
    if choice is None:
        return None
    if choice.mode == "named":
        return NamedToolChoice(name=choice.name or "")
    return choice.mode


async def final_turn(events: AsyncGenerator[TurnEvent, None]) -> TurnEnded:
    """Drain a started turn's events; the TurnEnded at the end."""
    async with aclosing(events):
        async for event in events:
            if isinstance(event, TurnEnded):
                return event
    raise AssertionError("run_turn ended without TurnEnded")


async def get_compat(request: Request) -> CompatService:
    state = request.state
    turns: TurnService = state.turns
    settings: GatewaySettings = state.settings
    model: str = state.model_name
    telemetry: Telemetry = state.telemetry
    return CompatService(turns, settings, model, telemetry, state.limiter)


CompatDep = Annotated[CompatService, Depends(get_compat)]
# Claude Code sends it on every request; it narrows the tree search to that agent session.
SessionHintDep = Annotated[str | None, Header(alias="x-claude-code-session-id")]
