"""Path index: which turn ends a given conversation prefix, so a stateless request (the whole
conversation resent every time) finds its place in a session tree.

A *path hash* names the content of a conversation prefix as a chain of sha256 digests:

    root_path_hash(model, system, tools)   the session's root turn
    extend_path_hash(h, message)           the prefix `h` followed by one more message

Only *anchor* turns are indexed: the root and assistant turns, the turns a new input turn can
hang under. An assistant turn's hash extends the hash of every message on its path with its own
reply. Messages are hashed by what the model reads (role, text, tool-call names and arguments),
not by token ids: the ledger holds the ids the model *sampled*, which re-tokenizing the text a
client echoes back need not reproduce. Matching by content and then using the ledger's ids is
what keeps the prefix exact whatever the client re-renders. Assistant text is compared without
surrounding whitespace (clients trim it; the ledger keeps what was generated). Tool-call ids, names
of senders and other fields are ignored: the chat template does not render them.

Keys (with the default prefix `rg:`):

    rg:{sid}:paths          HASH  path hash -> turn id: the session's anchors (in the session's
                                  slot; `SessionStore.delete_session` deletes it with the session)
    rg:{tenant:<tenant>}:paths
                            HASH  path hash -> "<session id>:<turn id>": the tenant's latest
                                  session holding that path, and the anchor in it (another slot:
                                  sent with the session's entry but not atomically with it, so it
                                  may briefly lag or name a turn that is gone: callers check the
                                  anchor when they use it; `forget` drops a deleted session's)

Root hashes go only into the session's own hash: a conversation that shares nothing but the system
prompt with an earlier one gets a session of its own unless the caller names the session.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from redis.commands.core import AsyncScript

from sessions.codec import raise_for_reply
from sessions.durability import NO_WAIT, run_durably
from sessions.keys import SessionKeys, check_tenant, tenant_paths_key
from sessions.redis_client import StoreClient

HASH_LEN: Final[int] = 32  # hex chars kept of each sha256 (128 bits)
MAX_CANDIDATES: Final[int] = 4  # tenant-wide entries tried before giving up on a lookup

# KEYS: meta, paths. ARGV[1] tenant, then (path hash, turn id) pairs. Writes nothing unless the
# session exists and belongs to the tenant (a late write must not resurrect a deleted session).
_RECORD: Final = """
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then return {'NOT_FOUND'} end
redis.call('HSET', KEYS[2], unpack(ARGV, 2))
return {'OK'}
"""

# KEYS: tenant paths. ARGV[1] session id, then path hashes: drop those still naming the session.
_FORGET: Final = """
local n = 0
local prefix = ARGV[1] .. ':'
for i = 2, #ARGV do
  local value = redis.call('HGET', KEYS[1], ARGV[i])
  if value and string.sub(value, 1, #prefix) == prefix then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n
"""


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:HASH_LEN]


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "".join(parts)


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def canonical_message(message: Mapping[str, Any]) -> str:
    """The part of a message the model reads, as canonical JSON (see the module docstring).

    `message` is a native message: `role`, `content` (text, text blocks or None) and, for
    assistant messages, `tool_calls: [{name, arguments}]` (arguments a dict or JSON text)."""
    role = str(message.get("role", ""))
    text = _text(message.get("content"))
    calls: list[list[Any]] = []
    if role == "assistant":
        text = text.strip()
        calls = [[str(c.get("name", "")), _arguments(c.get("arguments", {}))]
                 for c in message.get("tool_calls") or ()]
    return json.dumps([role, text, calls], sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))


def canonical_tool(tool: Mapping[str, Any]) -> list[Any]:
    """[name, description, parameters] of an OpenAI-, Anthropic- or flat-shaped tool."""
    inner = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
    assert isinstance(inner, Mapping)
    parameters = inner.get("parameters", inner.get("input_schema"))
    return [inner.get("name"), inner.get("description"), parameters]


def root_path_hash(*, model: str, system: str | None,
                   tools: Sequence[Mapping[str, Any]] = ()) -> str:
    """Path hash of a session root: the served model, the system prompt and the tools."""
    body = json.dumps([model, system, [canonical_tool(t) for t in tools]], sort_keys=True,
                      ensure_ascii=False, separators=(",", ":"))
    return _digest("root", body)


def extend_path_hash(parent: str, message: Mapping[str, Any]) -> str:
    """Path hash of the prefix `parent` followed by `message`."""
    return _digest(parent, canonical_message(message))


def path_hashes(root: str, messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """[h0, h1, ..., hn]: h0 = `root`, hk = the hash after `messages[:k]`."""
    hashes = [root]
    for message in messages:
        hashes.append(extend_path_hash(hashes[-1], message))
    return hashes


@dataclass(frozen=True, slots=True)
class PathMatch:
    """`turn_id` of `session_id` ends the path of the first `num_matched` messages."""

    session_id: str
    turn_id: str
    num_matched: int


class PathIndex:
    """Reads and writes the path index. Holds no state besides the client and script handles."""

    def __init__(self, redis: StoreClient, *, key_prefix: str = "rg:") -> None:
        self.redis = redis
        self.key_prefix = key_prefix
        self._record: AsyncScript = redis.register_script(_RECORD)
        self._forget: AsyncScript = redis.register_script(_FORGET)

    async def record(self, tenant: str, session_id: str, anchors: Mapping[str, str], *,
                     tenant_wide: bool = True) -> None:
        """Index `anchors` (path hash -> turn id) of the session; with `tenant_wide`, also make
        the session the tenant's answer for those hashes (one round trip for both). Raises
        SessionNotFound (the session is gone or another tenant's; the session's index is not
        written then, and a tenant-wide entry it leaves names a missing session)."""
        check_tenant(tenant)
        if not anchors:
            return
        keys = SessionKeys(self.key_prefix, session_id)
        flat = [v for pair in anchors.items() for v in pair]
        extra: list[tuple[str, ...]] = []
        if tenant_wide:
            tenant_key = tenant_paths_key(self.key_prefix, tenant)
            extra.append(("HSET", tenant_key, *(v for path_hash, turn_id in anchors.items()
                                                for v in (path_hash, f"{session_id}:{turn_id}"))))
        # The index is a cache of where a path ends: it is not waited for (NO_WAIT).
        reply, _ = await run_durably(self.redis, self._record, [keys.meta, keys.paths],
                                     [tenant, *flat], NO_WAIT, extra=extra)
        if reply[0] != b"OK":
            raise_for_reply(reply, session_id)

    async def find(self, tenant: str, hashes: Sequence[str], *,
                   session_id: str | None = None) -> list[PathMatch]:
        """Anchors among `hashes` (a `path_hashes` list, or a prefix of one), deepest first, in
        one round trip. With `session_id`, only that session's anchors count (roots included;
        [] when the session is not the tenant's); without, the tenant-wide entries (assistant
        turns only, at most MAX_CANDIDATES, unchecked: the caller's use of one checks it).
        Does not mutate."""
        check_tenant(tenant)
        if session_id is not None:
            return await self._find_in(tenant, session_id, hashes)
        values: list[Any] = await self.redis.hmget(tenant_paths_key(self.key_prefix, tenant),
                                                   list(hashes))
        found: list[PathMatch] = []
        for k in range(len(hashes) - 1, -1, -1):
            if values[k] is not None and len(found) < MAX_CANDIDATES:
                sid, _, turn_id = values[k].decode().partition(":")
                found.append(PathMatch(sid, turn_id, k))
        return found

    async def session_hashes(self, session_id: str) -> list[str]:
        """Every path hash indexed in the session (for `forget`)."""
        raw: list[Any] = await self.redis.hkeys(SessionKeys(self.key_prefix, session_id).paths)
        return [h.decode() for h in raw]

    async def forget(self, tenant: str, session_id: str, hashes: Sequence[str]) -> None:
        """Drop the tenant-wide entries of `hashes` that still name `session_id`."""
        if hashes:
            await self._forget(keys=[tenant_paths_key(self.key_prefix, tenant)],
                               args=[session_id, *hashes])

    async def check_invariants(self, session_id: str) -> None:
        """Raise AssertionError unless every anchor of the session is a root or assistant turn
        of it, and the root's hash is present when any anchor is."""
        keys = SessionKeys(self.key_prefix, session_id)
        anchors: dict[Any, Any] = await self.redis.hgetall(keys.paths)
        if not anchors:
            return
        root = await self.redis.hget(keys.meta, "root")
        assert root is not None, f"session {session_id}: path index outlives the session"
        assert root in anchors.values(), f"session {session_id}: root is not indexed"
        async with self.redis.pipeline(transaction=False) as pipe:
            for turn_id in anchors.values():
                pipe.hget(keys.turn(turn_id.decode()), "role")
            roles = await pipe.execute()
        for (path_hash, turn_id), role in zip(anchors.items(), roles, strict=True):
            assert role in (b"root", b"assistant"), (
                f"session {session_id}: path {path_hash!r} names {turn_id!r} of role {role!r}")

    async def _find_in(self, tenant: str, session_id: str, hashes: Sequence[str]
                       ) -> list[PathMatch]:
        keys = SessionKeys(self.key_prefix, session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.meta, "tenant")
            pipe.hmget(keys.paths, list(hashes))
            owner, turn_ids = await pipe.execute()
        if owner != tenant.encode():
            return []
        return [PathMatch(session_id, turn_ids[k].decode(), k)
                for k in range(len(hashes) - 1, -1, -1) if turn_ids[k] is not None]
