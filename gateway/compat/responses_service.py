"""One `POST /v1/responses` as a turn of the tenant's session tree.

    previous_response_id   the stored response's assistant turn is the parent: the input items
                           are appended under it (a fork when it already has children). Its
                           instructions are not carried over (OpenAI's rule): when this
                           request's instructions or tools differ from those the parent was
                           generated under, the conversation is rebuilt from the tree (every
                           message on the parent's path, tool calls and results included) and
                           placed like a full resend, under a root with the new ones
    none                   the input is the whole conversation (Codex, openai-agents' default,
                           `store: false`): placed by message-prefix hashes exactly as chat is,
                           `prompt_cache_key` naming the session (one worker, as a session)

Leading system / developer items and `instructions` make the session's system prompt (the
instructions first). The driver (`drive`) turns the turn's events into the response's events,
stores the record before the terminal event goes out (a client's next request must find it),
and ends as `cancelled` when its task is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from gateway.compat.conversation import Conversation, Generation
from gateway.compat.conversations_store import Anchor, ConversationStore
from gateway.compat.placement import reply_message, reply_path_hash
from gateway.compat.responses_events import ResponseEvents
from gateway.compat.responses_items import (
    RESPONSE_PREFIX,
    native_messages,
    native_tools,
    normalize_input,
    response_of_item,
    split_system,
    with_ids,
)
from gateway.compat.responses_objects import (
    conversation_id_of,
    ended_fields,
    generation_of,
    skeleton,
)
from gateway.compat.responses_schemas import ResponseCreateRequest, ResponseInputRequest
from gateway.compat.responses_store import ResponseNotFound, ResponseStore, StoredResponse
from gateway.compat.runner import CompatService, StartedTurn
from gateway.errors import ApiError, InvalidRequest, exception_error
from gateway.turns import TurnEnded, TurnStarted
from sessions import root_path_hash

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Prepared:
    """A checked request. `conversation.messages` is the whole conversation, or only the new
    messages when `after` (the stored response to append under) is set."""

    conversation: Conversation
    input_items: list[dict[str, Any]]  # the request's items, item references resolved
    custom_tools: frozenset[str]
    root_hash: str
    after: Anchor | None = None
    conversation_id: str | None = None  # the Conversations API log the response joins


@dataclass(frozen=True)
class Outcome:
    """A finished response; `failure`: the exception it failed with, if it failed (its HTTP
    answer when not streamed)."""

    response: dict[str, Any]
    failure: Exception | None = None


class ResponsesService:
    """Built per request; holds no state of its own."""

    def __init__(self, compat: CompatService, store: ResponseStore,
                 conversations: ConversationStore) -> None:
        self.compat = compat
        self.store = store
        self.conversations = conversations

    async def prepare(self, tenant: str, body: ResponseInputRequest,
                      create: ResponseCreateRequest | None = None) -> Prepared:
        """Check and map a request (`create`: the full create request, for its generation
        options). Raises InvalidRequest naming `param`; reads the store for
        `previous_response_id` and item references, writes nothing."""
        items = await self._resolved(tenant, normalize_input(body.input))
        tools, custom = native_tools(body.tools)
        after: Anchor | None = None
        conversation_id = None
        if body.previous_response_id is not None:
            if body.conversation is not None:
                raise InvalidRequest("previous_response_id and conversation cannot be used "
                                     "together", param="previous_response_id")
            previous = await self._previous(tenant, body.previous_response_id)
            after = Anchor(previous.session_id, previous.turn_id, previous.path_hash,
                           previous.root_hash)
            system, messages = body.instructions, native_messages(items)
            log: list[dict[str, Any]] = []
        else:
            log = []
            if body.conversation is not None:
                conversation = await self.conversations.get(tenant,
                                                             conversation_id_of(body.conversation))
                conversation_id, after = conversation.id, conversation.anchor
                log = await self.conversations.items(conversation.id)
            leading, messages = split_system(native_messages([*log, *items],
                                                             offset=-len(log)))
            system = "\n".join(p for p in [body.instructions or "", *leading] if p) or None
        if not messages:
            raise InvalidRequest("input: at least one user message or tool output is required",
                                 param="input")
        root_hash = root_path_hash(model=self.compat.model, system=system, tools=tools)
        if after is not None and after.root_hash != root_hash:
            if body.previous_response_id is not None:  # rebuilt under the new root
                messages = [*await self._history(tenant, after), *messages]
            after = None
        elif after is not None and body.conversation is not None:
            if after.num_items > len(log):
                after = None
            else:  # only what the anchor's path does not hold yet
                messages = native_messages([*log[after.num_items:], *items],
                                           offset=after.num_items - len(log))
        if not messages:
            raise InvalidRequest("input: at least one user message or tool output is required",
                                 param="input")
        generation = generation_of(create, tools) if create else Generation(max_tokens=1)
        conversation_ = Conversation(model=body.model or self.compat.model, system=system,
                                     messages=tuple(messages), generation=generation,
                                     tools=tools, stream=bool(create and create.stream),
                                     cache_salt=create.cache_salt if create else None)
        return Prepared(conversation_, items, custom, root_hash, after, conversation_id)

    async def _previous(self, tenant: str, response_id: str) -> StoredResponse:
        try:
            previous = await self.store.get(tenant, response_id)
        except ResponseNotFound:
            raise ApiError(f"Previous response with id '{response_id}' not found.",
                           param="previous_response_id",
                           error_type="previous_response_not_found") from None
        if not previous.turn_id:
            raise InvalidRequest(f"Previous response '{response_id}' has no output to continue "
                                 f"from (status {previous.response.get('status')!r})",
                                 param="previous_response_id")
        return previous

    async def _resolved(self, tenant: str, items: list[dict[str, Any]]
                        ) -> list[dict[str, Any]]:
        """Items with each `item_reference` replaced by the stored item it names."""
        out: list[dict[str, Any]] = []
        for i, item in enumerate(items):
            if item["type"] != "item_reference":
                out.append(item)
                continue
            ref = item.get("id")
            owner = response_of_item(ref) if isinstance(ref, str) else None
            found = None
            if owner is not None:
                try:
                    record = await self.store.get(tenant, owner)
                    found = next((x for x in [*record.input_items, *record.response["output"]]
                                  if x.get("id") == ref), None)
                except ResponseNotFound:
                    pass
            if found is None:
                raise InvalidRequest(f"input[{i}].id: item {ref!r} not found",
                                     param=f"input[{i}].id")
            out.append(dict(found))
        return out

    async def _history(self, tenant: str, previous: Anchor) -> list[dict[str, Any]]:
        """Native messages on the path to the stored response's turn (its reply included)."""
        store = self.compat.turns.store
        ids = await store.path_turn_ids(previous.session_id, previous.turn_id, tenant=tenant)
        messages: list[dict[str, Any]] = []
        for turn_id in ids:
            turn = await store.get_turn(previous.session_id, turn_id, tenant=tenant)
            if turn.role == "assistant":
                messages.append(reply_message(turn))
            elif turn.is_input:
                messages.extend(dict(m) for m in turn.messages)
        return messages

    async def start(self, tenant: str, prepared: Prepared, *,
                    prompt_cache_key: str | None) -> StartedTurn:
        """Reserve the branch and start generating. Raises as `CompatService.start`."""
        after = prepared.after
        if after is not None:
            return await self.compat.start_after(
                tenant, prepared.conversation, session_id=after.session_id,
                parent_turn_id=after.turn_id, parent_path_hash=after.path_hash)
        return await self.compat.start(tenant, prepared.conversation,
                                       session_hint=prompt_cache_key)

    async def drive(self, tenant: str, body: ResponseCreateRequest, prepared: Prepared,
                    started: StartedTurn, emit: Emit) -> Outcome:
        """Run the started turn to its end, emitting the response's events; returns the final
        response object (stored first when `body.store`). Cancelling the task that runs it
        aborts generation and ends the response as cancelled."""
        response = skeleton(body, response_id_of(started), prepared.conversation_id)
        events = ResponseEvents(response, prepared.custom_tools)
        for event in events.begin():
            emit(event)
        ended: TurnEnded | None = None
        status, error, failure = "completed", None, None
        try:
            async with aclosing(started.events) as stream:
                async for item in stream:
                    if isinstance(item, TurnEnded):
                        ended = item
                    elif not isinstance(item, TurnStarted):
                        for event in events.feed(item):
                            emit(event)
        except asyncio.CancelledError:
            status = "cancelled"
        except Exception as exc:  # noqa: BLE001 - a failed generation is a failed response
            status, error, failure = "failed", _error_of(exc), exc
        for event in events.finish():
            emit(event)
        final = {**response, "status": status, "error": error, "output": events.items}
        if ended is not None:
            final.update(ended_fields(ended.turn))
        record = StoredResponse(
            tenant=tenant, response=final, input_items=with_ids(prepared.input_items,
                                                                final["id"]),
            session_id=started.placement.session_id,
            turn_id=ended.turn.id if ended is not None else "", root_hash=prepared.root_hash,
            path_hash=reply_path_hash(started.placement, ended.turn) if ended else "",
            custom_tools=sorted(prepared.custom_tools))
        try:
            if body.store:
                await self.store.save(record)
            if prepared.conversation_id is not None and ended is not None:
                await self.conversations.append(
                    prepared.conversation_id, [*record.input_items, *events.items],
                    Anchor(record.session_id, record.turn_id, record.path_hash,
                           record.root_hash))
        except Exception as exc:  # noqa: BLE001 - not stored: the client must not rely on it
            final, failure = {**final, "status": "failed", "error": _error_of(exc)}, exc
        emit(events.terminal(final))
        return Outcome(final, failure)

    async def count_input_tokens(self, tenant: str, body: ResponseInputRequest) -> int:
        prepared = await self.prepare(tenant, body)
        if prepared.after is None:
            return self.compat.count_tokens(prepared.conversation)
        store = self.compat.turns.store
        after = prepared.after
        path = await store.token_path(after.session_id, after.turn_id, tenant=tenant)
        renderer = self.compat.turns.renderer
        tools = self.compat.turns.toolsets.of(prepared.conversation.tools)
        delta = renderer.input_token_ids(prepared.conversation.messages, tools=tools,
                                         system=prepared.conversation.system, after_root=False)
        return len(path) + len(delta)


def _error_of(exc: Exception) -> dict[str, str]:
    """A response's `error`: OpenAI's code (`context_length_exceeded`, ...) and message."""
    _, body = exception_error("openai", exc, None)
    return {"code": body["error"]["code"], "message": body["error"]["message"]}


def response_id_of(started: StartedTurn) -> str:
    return RESPONSE_PREFIX + started.started.input_turn_id
