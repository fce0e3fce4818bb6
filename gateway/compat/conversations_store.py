"""Conversations (OpenAI's Conversations API) in Redis / Valkey: a linear, mutable log of items
over the session tree.

A conversation is a moving branch head: its `anchor` is the assistant turn of the last response
generated in it, and the number of items that turn's path covers. A response in the
conversation appends the items added since under that turn (the tree's KV is reused), then the
response's input and output items are appended to the log and the anchor moves to its reply.
Deleting an item the anchor covers drops the anchor: the next response is placed from the whole
log by prefix, as a stateless request is.

    <prefix>conv:{<id>}         HASH  tenant, created_at, metadata (JSON), anchor (JSON or '')
    <prefix>conv:{<id>}:items   LIST  the items, JSON, oldest first

Both keys share the id's hash tag (one cluster slot) and live as long as stored responses,
refreshed on every write.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from gateway.errors import ApiError
from sessions.redis_client import StoreClient

MAX_ITEMS_PER_ADD = 20  # OpenAI's limit on items in one create or add


class ConversationNotFound(ApiError):
    error_type = "not_found"

    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"Conversation with id '{conversation_id}' not found.",
                         param="conversation_id")


@dataclass(frozen=True)
class Anchor:
    """Where a conversation's log continues in the tree: `turn_id` (an assistant turn of
    `session_id`) covers the log's first `num_items` items; `path_hash` is that path's hash."""

    session_id: str
    turn_id: str
    path_hash: str
    root_hash: str = ""
    num_items: int = 0


@dataclass(frozen=True)
class Conversation:
    id: str
    tenant: str
    created_at: int
    metadata: dict[str, str]
    anchor: Anchor | None

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}


class ConversationStore:
    """Stateless besides the client."""

    def __init__(self, redis: StoreClient, *, key_prefix: str, retention_s: int) -> None:
        self.redis = redis
        self.key_prefix = key_prefix
        self.retention_s = retention_s

    def _keys(self, conversation_id: str) -> tuple[str, str]:
        base = f"{self.key_prefix}conv:{{{conversation_id}}}"
        return base, f"{base}:items"

    async def create(self, tenant: str, metadata: dict[str, str],
                     items: list[dict[str, Any]]) -> Conversation:
        conversation_id = f"conv_{secrets.token_hex(16)}"
        meta, _ = self._keys(conversation_id)
        created_at = int(time.time())
        await self.redis.hset(meta, mapping={"tenant": tenant, "created_at": created_at,
                                             "metadata": json.dumps(metadata), "anchor": ""})
        await self.redis.expire(meta, self.retention_s)
        if items:
            await self.append(conversation_id, items)
        return Conversation(conversation_id, tenant, created_at, metadata, None)

    async def get(self, tenant: str, conversation_id: str) -> Conversation:
        """Raises ConversationNotFound (also for another tenant's)."""
        meta, _ = self._keys(conversation_id)
        raw = {_text(k): _text(v) for k, v in (await self.redis.hgetall(meta)).items()}
        if raw.get("tenant") != tenant:
            raise ConversationNotFound(conversation_id)
        anchor = Anchor(**json.loads(raw["anchor"])) if raw.get("anchor") else None
        return Conversation(conversation_id, tenant, int(raw["created_at"]),
                            json.loads(raw["metadata"]), anchor)

    async def set_metadata(self, conversation: Conversation, metadata: dict[str, str]
                           ) -> Conversation:
        meta, _ = self._keys(conversation.id)
        await self.redis.hset(meta, "metadata", json.dumps(metadata))
        return Conversation(conversation.id, conversation.tenant, conversation.created_at,
                            metadata, conversation.anchor)

    async def delete(self, conversation: Conversation) -> None:
        await self.redis.delete(*self._keys(conversation.id))

    async def items(self, conversation_id: str) -> list[dict[str, Any]]:
        _, key = self._keys(conversation_id)
        return [json.loads(raw) for raw in await self.redis.lrange(key, 0, -1)]

    async def append(self, conversation_id: str, items: list[dict[str, Any]],
                     anchor: Anchor | None = None) -> int:
        """Append items (each with its `id`); with `anchor`, move the anchor to it, covering
        the log as it is after this append. Returns the log's length."""
        meta, key = self._keys(conversation_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            if items:
                pipe.rpush(key, *(json.dumps(item) for item in items))
            pipe.llen(key)
            pipe.expire(key, self.retention_s)
            pipe.expire(meta, self.retention_s)
            replies = await pipe.execute()
        length = int(replies[1 if items else 0])
        if anchor is not None:
            moved = Anchor(anchor.session_id, anchor.turn_id, anchor.path_hash,
                           anchor.root_hash, length)
            await self.redis.hset(meta, "anchor", json.dumps(moved.__dict__))
        return length

    async def delete_item(self, conversation: Conversation, item_id: str) -> None:
        """Raises ApiError (404) for an unknown item. Drops the anchor when it covered it."""
        meta, key = self._keys(conversation.id)
        items = await self.items(conversation.id)
        index = next((i for i, item in enumerate(items) if item.get("id") == item_id), None)
        if index is None:
            raise ApiError(f"Item with id '{item_id}' not found.", error_type="not_found",
                           param="item_id")
        await self.redis.lrem(key, 1, json.dumps(items[index]))
        if conversation.anchor is not None and index < conversation.anchor.num_items:
            await self.redis.hset(meta, "anchor", "")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
