"""Native session API: `/v1/sessions` and its turns, forks and rewinds."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.deps import (
    ExpectedVersionDep,
    IdempotencyDep,
    IdempotencyKeyDep,
    PrincipalDep,
    Services,
    ServicesDep,
    SessionStoreDep,
    TelemetryDep,
    TenantDep,
    TurnServiceDep,
)
from gateway.errors import InFlight, InvalidRequest, error_responses, request_id_of
from gateway.generation import TurnResume
from gateway.idempotency import Claim, IdempotencyStore, Replay, request_hash
from gateway.keepalive import SSE_COMMENT_PING, keepalive
from gateway.rate_limits import Admission, refunded_on_error
from gateway.schemas import (
    AppendTurnRequest,
    BranchView,
    CreateSessionRequest,
    ForkRequest,
    RewindRequest,
    SessionCreated,
    SessionView,
    TurnView,
)
from gateway.shared_streams import SharedStreams
from gateway.telemetry import Telemetry, traced_turn
from gateway.tool_prompt import normalize_tools
from gateway.turns import TurnEnded, TurnService, TurnStarted
from gateway.views import SSE_HEADERS, replayed_stream, session_view, sse_stream, turn_view
from sessions import Session, VersionConflict

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
_ERRORS = error_responses(400, 401, 404, 409, 412, 413, 422, 503)


async def _once(idem: IdempotencyStore, tenant: str, key: str | None, request: Request,
                body: Any, compute: Callable[[], Awaitable[tuple[int, Any]]]) -> JSONResponse:
    req_hash = request_hash(request.method, request.url.path, body)
    status, content = await idem.run(tenant, key, req_hash or "", compute)
    return JSONResponse(content, status_code=status)


def _branches(session: Session) -> dict[str, Any]:
    view = BranchView(id=session.id, version=session.version, branches=dict(session.branches))
    return view.model_dump(mode="json")


@router.post("", status_code=201, response_model=SessionCreated, responses=_ERRORS)
async def create_session(body: CreateSessionRequest, request: Request, tenant: TenantDep,
                         store: SessionStoreDep, turns: TurnServiceDep, idem: IdempotencyDep,
                         key: IdempotencyKeyDep = None) -> JSONResponse:
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    tool_defs = normalize_tools(tools)  # InvalidToolSchema (400) before anything is written

    async def compute() -> tuple[int, Any]:
        session = await store.create_session(
            tenant, body.model or request.state.model_name,
            system_token_ids=turns.renderer.system_token_ids(body.system, tool_defs),
            system=body.system, tools=tools, metadata=body.metadata)
        created = SessionCreated(id=session.id, branch=session.default_branch,
                                 head_turn_id=session.head(), version=session.version)
        return 201, created.model_dump()

    return await _once(idem, tenant, key, request, body.model_dump(mode="json"), compute)


@router.get("/{session_id}", responses=_ERRORS)
async def get_session(session_id: str, tenant: TenantDep, store: SessionStoreDep,
                      response: Response) -> SessionView:
    session = await store.get_session(session_id, tenant=tenant)
    tree = await store.get_tree(session_id, tenant=tenant)
    response.headers["ETag"] = session.etag
    return session_view(session, tree)


@router.delete("/{session_id}", status_code=204, responses=_ERRORS)
async def delete_session(session_id: str, tenant: TenantDep, store: SessionStoreDep,
                         turns: TurnServiceDep, expected: ExpectedVersionDep,
                      telemetry: TelemetryDep) -> Response:
    if expected is not None:
        session = await store.get_session(session_id, tenant=tenant)
        if session.version != expected:
            raise VersionConflict(session_id, expected, session.version)
    await turns.delete(tenant, session_id)
    telemetry.live.publish(session_id, {"type": "session.deleted"})  # its event streams end
    return Response(status_code=204)


@router.get("/{session_id}/turns/{turn_id}", responses=_ERRORS)
async def get_turn(session_id: str, turn_id: str, tenant: TenantDep,
                   store: SessionStoreDep) -> TurnView:
    return turn_view(await store.get_turn(session_id, turn_id, tenant=tenant))


@router.post("/{session_id}/turns", response_model=TurnView, responses={
    **_ERRORS, 200: {"content": {"application/json": {}, "text/event-stream": {}}}})
async def append_turn(session_id: str, body: AppendTurnRequest, request: Request,
                      principal: PrincipalDep, services: ServicesDep,
                      expected: ExpectedVersionDep, key: IdempotencyKeyDep = None) -> Response:
    settings = services.settings
    if len(body.messages) > settings.max_messages:
        raise InvalidRequest(f"at most {settings.max_messages} messages per turn")
    # Limits first: a turn over one is refused before any store write or engine work.
    admission = await services.limiter.admit(principal, body.generate.max_tokens)
    async with refunded_on_error(admission):
        response = await _append_turn(session_id, body, request, principal.tenant, services,
                                      expected, key, admission)
    if not body.generate.stream:
        await admission.settle()  # a replayed answer ran nothing (a no-op once settled)
    return response


async def _append_turn(session_id: str, body: AppendTurnRequest, request: Request,
                       tenant: str, services: Services, expected: int | None, key: str | None,
                       admission: Admission) -> Response:
    turns, idem, telemetry = services.turns, services.idempotency, services.telemetry
    req_hash = None  # only an Idempotency-Key needs the request's hash
    if key is not None:
        payload = {"body": body.model_dump(mode="json"), "if_match": expected}
        req_hash = request_hash(request.method, request.url.path, payload)
    if body.generate.stream:
        return await _stream_turn(session_id, body, request, tenant, turns, idem, expected,
                                  telemetry, key, req_hash, admission)
    events = admission.watch(traced_turn(telemetry, turns.run_turn(
        tenant, session_id, body, expected_version=expected, idempotency_key=key,
        request_hash=req_hash), model=request.state.model_name, session_id=session_id,
        max_tokens=body.generate.max_tokens))

    async def compute() -> tuple[int, Any]:
        async for event in events:
            if isinstance(event, TurnEnded):
                return 200, turn_view(event.turn, event.branch).model_dump(mode="json")
        raise AssertionError("run_turn ended without TurnEnded")

    status, content = await idem.run(tenant, key, req_hash or "", compute)
    return JSONResponse(content, status_code=status)


async def _stream_turn(session_id: str, body: AppendTurnRequest, request: Request, tenant: str,
                       turns: TurnService, idem: IdempotencyStore, expected: int | None,
                       telemetry: Telemetry, key: str | None, req_hash: str | None,
                       admission: Admission) -> Response:
    """A streamed turn. With an Idempotency-Key, a retry replays the finished turn, or
    continues one whose engine worker died mid-stream (SSE `error` of type turn_interrupted)."""
    claim: Claim | None = None
    resume: TurnResume | None = None
    streams: SharedStreams = request.state.streams
    keepalive_s = request.state.settings.sse_keepalive_s
    if key is not None and req_hash is not None:
        try:
            outcome = await idem.claim(tenant, key, req_hash)
        except InFlight:
            running = streams.get(idem.record_key(tenant, key))
            if running is None:
                raise  # the first request runs on another gateway replica
            await admission.settle()  # it joins the running turn: nothing more runs
            return _sse(keepalive(running.follow(request.headers.get("last-event-id")),
                                  keepalive_s, SSE_COMMENT_PING))
        if isinstance(outcome, Replay):
            await admission.settle()
            return _sse(replayed_stream(outcome.body["parent_turn_id"], outcome.body["turn"]))
        claim = outcome
        if claim.state is not None:
            resume = TurnResume.from_dict(claim.state["resume"])
    events = admission.watch(traced_turn(telemetry, turns.run_turn(
        tenant, session_id, body, expected_version=expected, resume=resume, interruptible=True,
        idempotency_key=key, request_hash=req_hash),
        model=request.state.model_name, session_id=session_id,
        max_tokens=body.generate.max_tokens))
    record = _IdempotentStream(idem, claim) if claim is not None else None
    try:
        first = await anext(events)
    except BaseException:
        if claim is not None:
            await idem.abandon(claim)
        raise
    assert isinstance(first, TurnStarted)
    num_sent = int(claim.state["num_events"]) if claim and claim.state else 0
    frames = sse_stream(first, events, request_id_of(request), record=record, num_sent=num_sent)
    if claim is not None:  # a retry with the key can join it while it runs
        frames = streams.start(claim.rkey, frames).follow()
    return _sse(keepalive(frames, keepalive_s, SSE_COMMENT_PING))


def _sse(frames: AsyncGenerator[bytes, None]) -> StreamingResponse:
    return StreamingResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)


class _IdempotentStream:
    """A stream's outcome under its Idempotency-Key (`gateway.views.StreamRecord`)."""

    def __init__(self, idem: IdempotencyStore, claim: Claim) -> None:
        self.idem = idem
        self.claim = claim

    async def ended(self, parent_turn_id: str, turn: dict[str, Any]) -> None:
        await self.idem.finish(self.claim, 200, {"parent_turn_id": parent_turn_id, "turn": turn})

    async def interrupted(self, resume: TurnResume, num_events: int) -> None:
        await self.idem.interrupt(self.claim, {"resume": resume.to_dict(),
                                               "num_events": num_events})

    async def failed(self) -> None:
        await self.idem.abandon(self.claim)


@router.post("/{session_id}/fork", status_code=201, response_model=BranchView,
             responses=_ERRORS)
async def fork(session_id: str, body: ForkRequest, request: Request, tenant: TenantDep,
               store: SessionStoreDep, idem: IdempotencyDep, expected: ExpectedVersionDep,
               key: IdempotencyKeyDep = None) -> JSONResponse:
    async def compute() -> tuple[int, Any]:
        session = await store.fork(session_id, body.from_turn_id, body.branch, tenant=tenant,
                                   expected_version=expected)
        return 201, _branches(session)

    payload = {"body": body.model_dump(), "if_match": expected}
    return await _once(idem, tenant, key, request, payload, compute)


@router.post("/{session_id}/rewind", response_model=BranchView, responses=_ERRORS)
async def rewind(session_id: str, body: RewindRequest, request: Request, tenant: TenantDep,
                 turns: TurnServiceDep, idem: IdempotencyDep, expected: ExpectedVersionDep,
                 key: IdempotencyKeyDep = None) -> JSONResponse:
    async def compute() -> tuple[int, Any]:
        session = await turns.rewind(tenant, session_id, body.branch, body.to_turn_id,
                                     expected_version=expected)
        return 200, _branches(session)

    payload = {"body": body.model_dump(), "if_match": expected}
    return await _once(idem, tenant, key, request, payload, compute)
