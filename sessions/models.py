"""The turn tree: sessions, turns and branches as frozen value objects.

A session is a tree of immutable turns. The root turn holds the rendered system prompt (and tools)
as token ids. Below it, turns alternate in the usual agent rhythm, although the tree does not
enforce it:

- an *input* turn (role `user`, `tool` or `system`) holds the messages the client appended (user
  text and/or tool results) and the token ids they rendered to;
- an *assistant* turn holds the model output: its token ids, its messages / tool calls, `usage`
  and `finish_reason`.

Every turn carries only its *delta* of token ids; the full prompt of a turn is the concatenation
of the deltas on its path from the root (`SessionStore.token_path`). Branches are named pointers
to a head turn; fork adds a pointer, rewind moves one back to an ancestor. Turns never change.

These objects are returned by `SessionStore`; they never cross into the engine, which receives
plain token id lists.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

Role = Literal["root", "user", "assistant", "tool", "system"]
ROLES: Final[frozenset[str]] = frozenset(get_args(Role))
INPUT_ROLES: Final[frozenset[str]] = frozenset({"user", "tool", "system"})
MAX_TOKEN_ID: Final[int] = 2**32 - 1
DEFAULT_BRANCH: Final[str] = "main"


def pack_token_ids(token_ids: Iterable[int]) -> bytes:
    """Pack token ids as little-endian uint32 (4 bytes each), the stored form of a turn's delta.

    Raises ValueError if an id is not an int in [0, 2**32 - 1].
    """
    ids = list(token_ids)
    for token_id in ids:
        # bool is an int subclass; a True "token id" is always a caller bug.
        if type(token_id) is not int or not 0 <= token_id <= MAX_TOKEN_ID:
            raise ValueError(f"token id {token_id!r} is not a uint32")
    return struct.pack(f"<{len(ids)}I", *ids)


def unpack_token_ids(data: bytes) -> tuple[int, ...]:
    """Inverse of `pack_token_ids`. Raises ValueError if len(data) is not a multiple of 4."""
    if len(data) % 4:
        raise ValueError(f"packed token ids have {len(data)} bytes, not a multiple of 4")
    return struct.unpack(f"<{len(data) // 4}I", data)


@dataclass(frozen=True, slots=True)
class NewTurn:
    """A turn to append (the store assigns id, parent, depth, seq, version and created_ms).

    `messages`, `tool_calls` and `usage` must be JSON-serializable; they are stored as JSON, so
    tuples come back as lists. Raises ValueError on a bad role or token id.
    """

    role: Role
    token_ids: Sequence[int] = ()
    messages: Sequence[Mapping[str, Any]] = ()
    tool_calls: Sequence[Mapping[str, Any]] = ()
    usage: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    worker: str | None = None  # the engine worker whose cache holds its KV (routing)

    def __post_init__(self) -> None:
        if self.role not in ROLES or self.role == "root":
            raise ValueError(f"a new turn cannot have role {self.role!r}")
        pack_token_ids(self.token_ids)  # validates; the store packs again when writing


@dataclass(frozen=True, slots=True)
class Turn:
    """An immutable node of the session tree.

    `parent_id` is None only for the root. `depth` is 0 at the root and parent.depth + 1 below.
    `seq` is the creation order within the session (root = 0). `version` is the session version
    produced by the mutation that created the turn. `created_ms` is the Redis server clock.
    """

    id: str
    session_id: str
    parent_id: str | None
    role: Role
    depth: int
    seq: int
    version: int
    created_ms: int
    token_ids: tuple[int, ...] = ()
    messages: tuple[dict[str, Any], ...] = ()
    tool_calls: tuple[dict[str, Any], ...] = ()
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    worker: str | None = None  # the engine worker that generated it (None: unknown)

    @property
    def num_tokens(self) -> int:
        """Number of token ids in this turn's delta."""
        return len(self.token_ids)

    @property
    def is_input(self) -> bool:
        """True for client-appended turns (user text, tool results, mid-session system text)."""
        return self.role in INPUT_ROLES


@dataclass(frozen=True, slots=True)
class TurnSummary:
    """One row of `SessionStore.get_tree`: the shape of a turn without its payload."""

    id: str
    parent_id: str | None
    role: Role
    depth: int
    seq: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Session:
    """Session metadata plus the branch pointers, as of `version`.

    `branches` maps branch name → head turn id; branch `default_branch` ("main") always exists.
    `version` starts at 1 (creation) and grows by one per successful mutation: it is the ETag.
    """

    id: str
    tenant: str
    model: str
    created_ms: int
    version: int
    root_turn_id: str
    default_branch: str = DEFAULT_BRANCH
    branches: Mapping[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    system: str | list[dict[str, Any]] | None = None
    tools: tuple[dict[str, Any], ...] = ()

    @property
    def etag(self) -> str:
        """Strong HTTP validator for this version, e.g. '"v3"'."""
        return f'"v{self.version}"'

    def head(self, branch: str | None = None) -> str:
        """Head turn id of `branch` (default branch if None). Raises KeyError if unknown."""
        return self.branches[branch or self.default_branch]


EventType = Literal["session.created", "turns.appended", "branch.created", "branch.moved"]


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """One entry of the session's event stream. `id` is the Redis stream id (SSE `id:`).

    `fields` always has `version`; per type: session.created {root, branch}; turns.appended
    {branch, parent, turn_ids (space-separated), head (new head, or '' if no branch moved)};
    branch.created {branch, turn}; branch.moved {branch, from, to}. Writers other than the store
    (e.g. generation deltas) may add types, so `type` is a plain str.
    """

    id: str
    type: str
    fields: Mapping[str, str]
