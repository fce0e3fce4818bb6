"""Where a stateless request lands in the tenant's session trees.

    h0 .. hn      path hashes of the conversation (`sessions.path_index`): h0 names the root
                  (served model, system prompt, tools), hk the first k messages after it
    anchor        the deepest indexed turn among h0 .. h(n-1): the root or an assistant turn
    new messages  messages[k:] after the anchor's k messages, appended as one input turn

Session: with a `session_hint` (`X-Claude-Code-Session-Id`) the session derived from
(tenant, hint, h0), created on first use (idempotently, so racing first requests agree); only its
anchors count, the root included, so a changed first message forks at the root. Without a hint,
the tenant-wide index of assistant turns; no match (nothing in common but perhaps the system
prompt) starts a new session.

Branch: the anchor's branch when the anchor is a branch head (the conversation goes on), else a
new branch forked at the anchor (an edited earlier message, or a regenerated reply).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from gateway.compat.conversation import Conversation
from gateway.rendering import TurnRenderer
from gateway.tool_prompt import normalize_tools
from sessions import SessionStore, Turn, path_hashes, root_path_hash
from sessions.keys import derived_session_id
from sessions.path_index import extend_path_hash

MAX_HINT_LEN = 256  # kept in the session's metadata


@dataclass(frozen=True)
class Placement:
    """The append a request turns into. `path_hashes` is h0 .. hn of its messages."""

    session_id: str
    parent_turn_id: str
    branch: str
    new_messages: tuple[dict[str, Any], ...]
    path_hashes: tuple[str, ...]
    num_matched: int  # messages already on the path to `parent_turn_id`
    is_new_session: bool


class TreeMapper:
    """Stateless besides its collaborators; cheap to build per request."""

    def __init__(self, store: SessionStore, renderer: TurnRenderer, model: str) -> None:
        self.store = store
        self.renderer = renderer
        self.model = model

    def hashes(self, conversation: Conversation) -> list[str]:
        """h0 .. hn of the conversation."""
        root = root_path_hash(model=self.model, system=conversation.system,
                              tools=conversation.tools)
        return path_hashes(root, conversation.messages)

    async def place(self, tenant: str, conversation: Conversation, *,
                    session_hint: str | None) -> Placement:
        """Find (or create) the session and anchor; fork a branch when the anchor is no head.

        Mutates the store only to create a session or a branch. Raises InvalidRequest (nothing
        to answer), InvalidToolSchema and session errors."""
        conversation.check_answerable()
        hashes = self.hashes(conversation)
        candidates = hashes[:-1]  # the last message is always new
        index = self.store.paths
        if session_hint is not None:
            key = _hint_key(session_hint, hashes[0])
            match = await index.find(tenant, candidates, session_id=_hinted_id(tenant, key))
        else:
            key, match = None, await index.find(tenant, candidates)
        if match is None:
            session_id, root_id = await self._create(tenant, conversation, session_hint, key,
                                                     hashes[0])
            return Placement(session_id, root_id, "main", conversation.messages, tuple(hashes),
                             0, True)
        branch = await self._branch_at(tenant, match.session_id, match.turn_id)
        return Placement(match.session_id, match.turn_id, branch,
                         conversation.messages[match.num_matched:], tuple(hashes),
                         match.num_matched, False)

    async def record_reply(self, tenant: str, placement: Placement, reply: Turn) -> None:
        """Index the generated assistant turn under the path of its conversation."""
        content = reply.messages[0].get("content", "") if reply.messages else ""
        message = {"role": "assistant", "content": content, "tool_calls": list(reply.tool_calls)}
        path_hash = extend_path_hash(placement.path_hashes[-1], message)
        await self.store.paths.record(tenant, placement.session_id, {path_hash: reply.id})

    async def _create(self, tenant: str, conversation: Conversation, hint: str | None,
                      key: str | None, root_hash: str) -> tuple[str, str]:
        metadata = {"source": "compat"}
        if hint is not None:
            metadata["session_hint"] = hint[:MAX_HINT_LEN]
        tool_defs = normalize_tools(conversation.tools)
        session = await self.store.create_session(
            tenant, self.model, system_token_ids=self.renderer.system_token_ids(
                conversation.system, tool_defs),
            system=conversation.system, tools=list(conversation.tools), metadata=metadata,
            idempotency_key=None if key is None else f"compat:{key}")
        await self.store.paths.record(tenant, session.id, {root_hash: session.root_turn_id},
                                      tenant_wide=False)
        return session.id, session.root_turn_id

    async def _branch_at(self, tenant: str, session_id: str, turn_id: str) -> str:
        session = await self.store.get_session(session_id, tenant=tenant)
        heads = [name for name, head in sorted(session.branches.items()) if head == turn_id]
        if heads:
            return session.default_branch if session.default_branch in heads else heads[0]
        branch = f"compat-{secrets.token_hex(4)}"
        await self.store.fork(session_id, turn_id, branch, tenant=tenant)
        return branch


def _hint_key(hint: str, root_hash: str) -> str:
    # Hashed: any header value names a session (never a 400), and the key stays short.
    return f"{hashlib.sha256(hint.encode()).hexdigest()[:32]}:{root_hash}"


def _hinted_id(tenant: str, key: str) -> str:
    return derived_session_id(tenant, f"compat:{key}")
