"""The trajectory tree: turn/branch model, the token ledger, and its Redis/Valkey store.

`SessionStore` (async, redis-py) keeps each session as a tree of immutable turns with packed
token ids; every mutation is one Lua script. `EmbeddedValkey` (in `sessions.embedded`) starts a
local server when no Redis URL is configured.
"""

from sessions.errors import (
    BranchBusy,
    BranchExists,
    BranchNotFound,
    ConflictError,
    HeadMoved,
    IdempotencyConflict,
    InvalidTreeOperation,
    NotFoundError,
    SessionError,
    SessionNotFound,
    StoreCorruption,
    TurnNotFound,
    VersionConflict,
)
from sessions.invariants import check_session_invariants
from sessions.models import (
    NewTurn,
    Session,
    SessionEvent,
    Turn,
    TurnSummary,
    pack_token_ids,
    unpack_token_ids,
)
from sessions.path_index import PathIndex, PathMatch, path_hashes, root_path_hash
from sessions.store import SessionStore

__all__ = [
    "BranchBusy",
    "BranchExists",
    "BranchNotFound",
    "ConflictError",
    "HeadMoved",
    "IdempotencyConflict",
    "InvalidTreeOperation",
    "NewTurn",
    "NotFoundError",
    "PathIndex",
    "PathMatch",
    "Session",
    "SessionError",
    "SessionEvent",
    "SessionNotFound",
    "SessionStore",
    "StoreCorruption",
    "Turn",
    "TurnNotFound",
    "TurnSummary",
    "VersionConflict",
    "check_session_invariants",
    "pack_token_ids",
    "path_hashes",
    "root_path_hash",
    "unpack_token_ids",
]
