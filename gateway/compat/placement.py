"""Where a stateless request lands in the tenant's session trees.

    h0 .. hn      path hashes of the conversation (`sessions.path_index`): h0 names the root
                  (served model, system prompt, tools), hk the first k messages after it
    anchor        the deepest indexed turn among h0 .. h(n-1): the root or an assistant turn
    new messages  messages[k:] after the anchor's k messages, appended as one input turn

Session: with a `session_hint` (`X-Claude-Code-Session-Id`) the session derived from
(tenant, hint, h0), created on first use (idempotently, so racing first requests agree); only its
anchors count, the root included, so a changed first message forks at the root. Without a hint,
the tenant-wide index of assistant turns (a few candidates, deepest first: an entry can name a
turn that is gone, which the turn's start finds out); no match starts a new session.

Branch: decided by the turn's start (`sessions.turn_commit`), which moves the anchor's branch
when the anchor is its head and no other turn holds it, and otherwise forks a branch at the
anchor (an edited earlier message, a regenerated reply, or two requests racing on one
conversation). A stateless client never sees a conflict.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from gateway.compat.conversation import Conversation
from gateway.rendering import TurnRenderer
from gateway.tool_prompt import ToolDef
from sessions import PathMatch, SessionStore, Turn, path_hashes, root_path_hash
from sessions.keys import derived_session_id
from sessions.path_index import extend_path_hash
from sessions.turn_commit import TurnStart

MAX_HINT_LEN = 256  # kept in the session's metadata


@dataclass(frozen=True)
class Placement:
    """The append a request turns into. `path_hashes` is h0 .. hn of its messages; `start` is
    set for a session created for it (the root is the parent; nothing else to read)."""

    session_id: str
    parent_turn_id: str
    new_messages: tuple[dict[str, Any], ...]
    path_hashes: tuple[str, ...]
    num_matched: int  # messages already on the path to `parent_turn_id`
    start: TurnStart | None = None


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

    async def candidates(self, tenant: str, conversation: Conversation, *,
                         session_hint: str | None) -> list[Placement]:
        """Places for the conversation in existing sessions, best first (one round trip; may
        be empty). Raises InvalidRequest (nothing to answer)."""
        conversation.check_answerable()
        hashes = self.hashes(conversation)
        session_id = None
        if session_hint is not None:
            session_id = _hinted_id(tenant, _hint_key(session_hint, hashes[0]))
        matches = await self.store.paths.find(tenant, hashes[:-1], session_id=session_id)
        return [self._placement(conversation, hashes, match) for match in matches]

    async def create(self, tenant: str, conversation: Conversation, tools: list[ToolDef], *,
                     session_hint: str | None) -> Placement:
        """A new session for the conversation (the hinted one, idempotently), with its root
        indexed; one round trip. Its `start` holds no lease: two requests that race into a new
        session meet at the commit, where the second forks."""
        hashes = self.hashes(conversation)
        metadata = {"source": "compat"}
        key = None
        if session_hint is not None:
            metadata["session_hint"] = session_hint[:MAX_HINT_LEN]
            key = f"compat:{_hint_key(session_hint, hashes[0])}"
        system_ids = self.renderer.system_token_ids(conversation.system, tools)
        session = await self.store.create_session(
            tenant, self.model, system_token_ids=system_ids, system=conversation.system,
            tools=list(conversation.tools), metadata=metadata, idempotency_key=key,
            root_path_hash=hashes[0])
        root = Turn(id=session.root_turn_id, session_id=session.id, parent_id=None,
                    role="root", depth=0, seq=0, version=1, created_ms=session.created_ms,
                    token_ids=tuple(system_ids))
        start = TurnStart(session, root, session.default_branch, "", False)
        return Placement(session.id, root.id, conversation.messages, tuple(hashes), 0, start)

    async def record_reply(self, tenant: str, placement: Placement, reply: Turn) -> None:
        """Index the generated assistant turn under the path of its conversation."""
        await self.store.paths.record(tenant, placement.session_id,
                                      {reply_path_hash(placement, reply): reply.id})

    @staticmethod
    def _placement(conversation: Conversation, hashes: list[str],
                   match: PathMatch) -> Placement:
        return Placement(match.session_id, match.turn_id,
                         conversation.messages[match.num_matched:], tuple(hashes),
                         match.num_matched)


def reply_message(reply: Turn) -> dict[str, Any]:
    """The native message of a generated assistant turn (its text and calls)."""
    content = reply.messages[0].get("content", "") if reply.messages else ""
    return {"role": "assistant", "content": content, "tool_calls": list(reply.tool_calls)}


def reply_path_hash(placement: Placement, reply: Turn) -> str:
    """The path hash of the conversation through `reply`, the turn generated for `placement`."""
    return extend_path_hash(placement.path_hashes[-1], reply_message(reply))


def _hint_key(hint: str, root_hash: str) -> str:
    # Hashed: any header value names a session (never a 400), and the key stays short.
    return f"{hashlib.sha256(hint.encode()).hexdigest()[:32]}:{root_hash}"


def _hinted_id(tenant: str, key: str) -> str:
    return derived_session_id(tenant, f"compat:{key}")
