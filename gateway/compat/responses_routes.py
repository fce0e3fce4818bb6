"""The OpenAI Responses API over the session tree (`gateway.compat.responses_service`).

    POST   /v1/responses                     create (JSON, `stream` SSE, `background`)
    GET    /v1/responses/{id}                a stored response; `stream=true` replays its events
                                             (`starting_after` skips those up to that number)
    DELETE /v1/responses/{id}                forget the record (the turn stays in its tree)
    GET    /v1/responses/{id}/input_items    the request's items (`after`, `limit`, `order`)
    POST   /v1/responses/input_tokens        the prompt's token count, generating nothing
    POST   /v1/responses/{id}/cancel         stop a response running on this gateway

Every response runs as a task (`gateway.compat.responses_runs`); a stream or a waiting request
reads its events. A stream closed by its client cancels the run unless it is `background`.
Errors before generation starts are HTTP errors in OpenAI's shape (with `param`); a failure
later is `response.failed` in a stream, the HTTP error of its kind otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.compat.conversations_store import ConversationStore
from gateway.compat.responses_events import ResponseEvents, replay_events, sse
from gateway.compat.responses_objects import skeleton
from gateway.compat.responses_runs import ResponseRuns, RunEvents
from gateway.compat.responses_schemas import ResponseCreateRequest, ResponseInputRequest
from gateway.compat.responses_service import Outcome, ResponsesService, response_id_of
from gateway.compat.responses_store import ResponseStore, StoredResponse
from gateway.compat.runner import TURN_HEADER, CompatDep
from gateway.deps import PrincipalDep, TenantDep
from gateway.error_catalog import retry_headers
from gateway.errors import ApiError, exception_error, status_for
from gateway.keepalive import SSE_COMMENT_PING, keepalive
from gateway.rate_limits import refunded_on_error
from gateway.views import SSE_HEADERS

router = APIRouter(prefix="/v1/responses", tags=["responses"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"description": 'OpenAI error body {"error": {message, type, param, code}}'}
    for code in (400, 401, 404, 503)}
MAX_LIST_LIMIT = 100


def get_response_store(request: Request) -> ResponseStore:
    store: ResponseStore = request.state.response_store
    return store


def get_conversation_store(request: Request) -> ConversationStore:
    store: ConversationStore = request.state.conversation_store
    return store


def get_runs(request: Request) -> ResponseRuns:
    runs: ResponseRuns = request.state.response_runs
    return runs


StoreDep = Annotated[ResponseStore, Depends(get_response_store)]
ConversationsDep = Annotated[ConversationStore, Depends(get_conversation_store)]
RunsDep = Annotated[ResponseRuns, Depends(get_runs)]


@router.post("", responses={**_ERRORS, 200: {"content": {"application/json": {},
                                                          "text/event-stream": {}}}})
async def create_response(body: ResponseCreateRequest, principal: PrincipalDep,
                          compat: CompatDep, store: StoreDep, conversations: ConversationsDep,
                          runs: RunsDep) -> Response:
    if body.background and not body.store:
        raise ApiError("background: a background response must be stored (store: true)",
                       param="background")
    tenant = principal.tenant
    service = ResponsesService(compat, store, conversations)
    admission = await compat.admit(principal, body.max_output_tokens)
    async with refunded_on_error(admission):
        prepared = await service.prepare(tenant, body, body)
        started = await service.start(tenant, prepared, prompt_cache_key=body.prompt_cache_key)
    response_id = response_id_of(started)
    events = RunEvents()

    async def driver() -> Outcome:
        try:
            return await service.drive(tenant, body, prepared, started, events.put)
        finally:
            events.close()

    if body.background and body.store:
        # Findable (and cancellable) from the moment the client holds its id.
        await store.save(StoredResponse(
            tenant, skeleton(body, response_id, prepared.conversation_id),
            prepared.input_items))
    task = runs.start(tenant, response_id, driver())
    headers = {**started.headers, TURN_HEADER: started.started.input_turn_id}
    if body.stream:
        return StreamingResponse(
            keepalive(_frames(events, task, body.background), compat.settings.sse_keepalive_s,
                      SSE_COMMENT_PING),
            media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    if body.background:
        return JSONResponse({**skeleton(body, response_id, prepared.conversation_id),
                             "status": "queued"}, headers=headers)
    outcome: Outcome = await task  # a client gone cancels the run with it
    return _outcome_response(outcome, headers)


async def _frames(events: RunEvents, task: Any, background: bool
                  ) -> AsyncGenerator[bytes, None]:
    try:
        async for event in events:
            yield sse(event)
    finally:
        if not background and not task.done():
            task.cancel()


def _outcome_response(outcome: Outcome, headers: dict[str, str]) -> JSONResponse:
    """The JSON answer: the response, or for a failed one the HTTP error of its failure (with
    `Retry-After` where waiting helps, e.g. a store outage)."""
    if outcome.failure is not None:
        status, error_type = status_for(outcome.failure)
        status, body = exception_error("openai", outcome.failure, None)
        return JSONResponse(body, status_code=status,
                            headers=retry_headers(error_type, status))
    return JSONResponse(outcome.response, headers=headers)


@router.post("/input_tokens", responses=_ERRORS)
async def input_tokens(body: ResponseInputRequest, tenant: TenantDep, compat: CompatDep,
                       store: StoreDep, conversations: ConversationsDep) -> dict[str, Any]:
    count = await ResponsesService(compat, store, conversations).count_input_tokens(tenant,
                                                                                   body)
    return {"object": "response.input_tokens", "input_tokens": count}


@router.get("/{response_id}", responses={**_ERRORS, 200: {"content": {
    "application/json": {}, "text/event-stream": {}}}})
async def get_response(response_id: str, tenant: TenantDep, store: StoreDep, runs: RunsDep,
                       stream: bool = False, starting_after: int | None = None) -> Response:
    running = runs.running(tenant, response_id)
    if running is not None and stream:
        await asyncio.wait({running})  # replay what it ends as; a reader gone leaves it running
    record = await store.get(tenant, response_id)
    if not stream:
        return JSONResponse(record.response)
    return StreamingResponse(_replay(record, starting_after), media_type="text/event-stream",
                             headers=SSE_HEADERS)


async def _replay(record: StoredResponse, starting_after: int | None
                  ) -> AsyncGenerator[bytes, None]:
    events = ResponseEvents({**record.response, "output": []},
                            frozenset(record.custom_tools))
    replayed = [*events.begin()]
    for item in replay_events(record.response.get("output", [])):
        replayed.extend(events.feed(item))
    replayed.extend(events.finish())
    if record.response.get("status") != "in_progress":
        replayed.append(events.terminal(record.response))
    for event in replayed:
        if starting_after is None or event["sequence_number"] > starting_after:
            yield sse(event)


@router.delete("/{response_id}", responses=_ERRORS)
async def delete_response(response_id: str, tenant: TenantDep, store: StoreDep
                          ) -> dict[str, Any]:
    await store.delete(tenant, response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.get("/{response_id}/input_items", responses=_ERRORS)
async def input_items(response_id: str, tenant: TenantDep, store: StoreDep,
                      after: str | None = None,
                      limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = 20,
                      order: Literal["asc", "desc"] = "desc") -> dict[str, Any]:
    record = await store.get(tenant, response_id)
    return item_page(record.input_items, after=after, limit=limit, order=order)


def item_page(items: list[dict[str, Any]], *, after: str | None, limit: int,
              order: str) -> dict[str, Any]:
    """One page of a list of items, OpenAI's list shape; `after`: the id the page follows."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise ApiError(f"after: no item {after!r} in this list", param="after")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}


@router.post("/{response_id}/cancel", responses=_ERRORS)
async def cancel_response(response_id: str, tenant: TenantDep, store: StoreDep,
                          runs: RunsDep) -> dict[str, Any]:
    running = runs.running(tenant, response_id)
    if running is not None:
        running.cancel()
        outcome: Outcome = await running
        return outcome.response
    record = await store.get(tenant, response_id)
    if record.response.get("status") not in ("cancelled",):
        raise ApiError(f"Response '{response_id}' is not running (status "
                       f"{record.response.get('status')!r}): only a running response can be "
                       "cancelled", param="response_id")
    return record.response
