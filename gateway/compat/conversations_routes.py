"""The OpenAI Conversations API (`gateway.compat.conversations_store`): a conversation is a log
of items whose last response's reply is a branch head of one session; `POST /v1/responses` with
`conversation` continues it.

    POST   /v1/conversations                         create {items?, metadata?}
    GET    /v1/conversations/{id}                    the conversation object
    POST   /v1/conversations/{id}                    update {metadata}
    DELETE /v1/conversations/{id}                    delete (the tree's turns stay)
    POST   /v1/conversations/{id}/items              add {items}
    GET    /v1/conversations/{id}/items              list (`after`, `limit`, `order`)
    GET    /v1/conversations/{id}/items/{item_id}    one item
    DELETE /v1/conversations/{id}/items/{item_id}    remove one item; the conversation back
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from gateway.compat.conversations_store import MAX_ITEMS_PER_ADD
from gateway.compat.responses_items import kind_prefix, native_messages, normalize_input
from gateway.compat.responses_routes import MAX_LIST_LIMIT, ConversationsDep, item_page
from gateway.deps import TenantDep
from gateway.errors import ApiError

router = APIRouter(prefix="/v1/conversations", tags=["conversations"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"description": 'OpenAI error body {"error": {message, type, param, code}}'}
    for code in (400, 401, 404, 503)}


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ConversationCreate(_Open):
    items: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_ITEMS_PER_ADD)
    metadata: dict[str, str] | None = Field(default=None, max_length=16)


class ConversationUpdate(_Open):
    metadata: dict[str, str] = Field(max_length=16)


class ItemsAdd(_Open):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS_PER_ADD)


def _checked(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as stored: checked as response input is (400 naming `items[i]...`), each with an
    id (`item_reference` is not allowed in a log)."""
    items = normalize_input(raw, where="items")
    for i, item in enumerate(items):
        if item["type"] == "item_reference":
            raise ApiError(f"items[{i}]: item_reference is not allowed here",
                           param=f"items[{i}]")
    native_messages(items, where="items")
    return [{**item, "id": item.get("id") or f"{kind_prefix(item['type'])}_{secrets.token_hex(16)}"}
            for item in items]


@router.post("", responses=_ERRORS)
async def create_conversation(body: ConversationCreate, tenant: TenantDep,
                              store: ConversationsDep) -> dict[str, Any]:
    conversation = await store.create(tenant, body.metadata or {}, _checked(body.items or []))
    return conversation.view()


@router.get("/{conversation_id}", responses=_ERRORS)
async def get_conversation(conversation_id: str, tenant: TenantDep,
                           store: ConversationsDep) -> dict[str, Any]:
    return (await store.get(tenant, conversation_id)).view()


@router.post("/{conversation_id}", responses=_ERRORS)
async def update_conversation(conversation_id: str, body: ConversationUpdate,
                              tenant: TenantDep, store: ConversationsDep) -> dict[str, Any]:
    conversation = await store.get(tenant, conversation_id)
    return (await store.set_metadata(conversation, body.metadata)).view()


@router.delete("/{conversation_id}", responses=_ERRORS)
async def delete_conversation(conversation_id: str, tenant: TenantDep,
                              store: ConversationsDep) -> dict[str, Any]:
    await store.delete(await store.get(tenant, conversation_id))
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


@router.post("/{conversation_id}/items", responses=_ERRORS)
async def add_items(conversation_id: str, body: ItemsAdd, tenant: TenantDep,
                    store: ConversationsDep) -> dict[str, Any]:
    conversation = await store.get(tenant, conversation_id)
    items = _checked(body.items)
    await store.append(conversation.id, items)
    return {"object": "list", "data": items, "first_id": items[0]["id"],
            "last_id": items[-1]["id"], "has_more": False}


@router.get("/{conversation_id}/items", responses=_ERRORS)
async def list_items(conversation_id: str, tenant: TenantDep, store: ConversationsDep,
                     after: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = 20,
                     order: Literal["asc", "desc"] = "desc") -> dict[str, Any]:
    conversation = await store.get(tenant, conversation_id)
    return item_page(await store.items(conversation.id), after=after, limit=limit,
                     order=order)


@router.get("/{conversation_id}/items/{item_id}", responses=_ERRORS)
async def get_item(conversation_id: str, item_id: str, tenant: TenantDep,
                   store: ConversationsDep) -> dict[str, Any]:
    conversation = await store.get(tenant, conversation_id)
    for item in await store.items(conversation.id):
        if item.get("id") == item_id:
            return item
    raise ApiError(f"Item with id '{item_id}' not found.", error_type="not_found",
                   param="item_id")


@router.delete("/{conversation_id}/items/{item_id}", responses=_ERRORS)
async def delete_item(conversation_id: str, item_id: str, tenant: TenantDep,
                      store: ConversationsDep) -> dict[str, Any]:
    conversation = await store.get(tenant, conversation_id)
    await store.delete_item(conversation, item_id)
    return conversation.view()
