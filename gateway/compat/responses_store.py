"""Stored responses (`store: true`) in Redis / Valkey, with a bounded lifetime.

A response is a turn of the tenant's session tree; this record is what the Responses API needs
beside the tree: the response object as returned, the request's input items verbatim (reasoning
items' `encrypted_content` included), and where the reply sits.

    <prefix>resp:{<response id>}   STRING  JSON record, EX = the retention (default 30 days)

The key carries its own hash tag, so each record is one slot of a cluster. A record of another
tenant, an expired one and a deleted one are all "not found" (404 in OpenAI's shape), so ids
never reveal another tenant's data. The records persist with the store (AOF / RDB): they survive
a gateway restart and a store restart as the session trees do.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from gateway.errors import ApiError
from sessions.redis_client import StoreClient

DEFAULT_RETENTION_S: Final[int] = 30 * 24 * 3600


class ResponseNotFound(ApiError):
    error_type = "not_found"

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Response with id '{response_id}' not found.", param="response_id")


@dataclass(frozen=True)
class StoredResponse:
    """One stored response. `turn_id` is its assistant turn ('' when it produced none: failed
    or cancelled); `root_hash` names the session root it was generated under (model, system,
    tools) and `path_hash` its conversation through the reply (`sessions.path_index`)."""

    tenant: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    session_id: str = ""
    turn_id: str = ""
    root_hash: str = ""
    path_hash: str = ""
    custom_tools: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.response["id"])


class ResponseStore:
    """Stateless besides the client."""

    def __init__(self, redis: StoreClient, *, key_prefix: str = "rg:",
                 retention_s: int = DEFAULT_RETENTION_S) -> None:
        if retention_s <= 0:
            raise ValueError("retention_s must be positive")
        self.redis = redis
        self.key_prefix = key_prefix
        self.retention_s = retention_s

    def key(self, response_id: str) -> str:
        return f"{self.key_prefix}resp:{{{response_id}}}"

    async def save(self, record: StoredResponse) -> None:
        """Write (or overwrite) the record; its lifetime starts again."""
        await self.redis.set(self.key(record.id), json.dumps(asdict(record)),
                             ex=self.retention_s)

    async def get(self, tenant: str, response_id: str) -> StoredResponse:
        """Raises ResponseNotFound (also for another tenant's record)."""
        raw = await self.redis.get(self.key(response_id))
        if raw is None:
            raise ResponseNotFound(response_id)
        data = json.loads(raw)
        if data.get("tenant") != tenant:
            raise ResponseNotFound(response_id)
        return StoredResponse(**data)

    async def delete(self, tenant: str, response_id: str) -> None:
        """Raises ResponseNotFound. The turn stays in its session tree (other responses may
        continue from it); only the record goes."""
        await self.get(tenant, response_id)
        await self.redis.delete(self.key(response_id))

    async def ttl_s(self, response_id: str) -> int:
        """Seconds the record has left (-2: none)."""
        return int(await self.redis.ttl(self.key(response_id)))
