"""A pure-Python model of one session tree, for the state machine test of the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sessions import (
    BranchExists,
    BranchNotFound,
    HeadMoved,
    InvalidTreeOperation,
    SessionError,
    TurnNotFound,
    VersionConflict,
)

Request = tuple[str, dict[str, Any]]


@dataclass
class ModelSession:
    """The dumb model of a session: parent pointers, deltas, branch heads, version, idem records."""

    sid: str
    tenant: str
    root: str
    parent: dict[str, str | None]
    tokens: dict[str, tuple[int, ...]]
    branches: dict[str, str]
    order: list[str]  # turn ids in creation order
    version: int = 1
    idem: dict[str, tuple[Request, object]] = field(default_factory=dict)

    def path(self, turn_id: str) -> list[str]:
        out: list[str] = []
        cur: str | None = turn_id
        while cur is not None:
            out.append(cur)
            cur = self.parent[cur]
        return out[::-1]

    def token_path(self, turn_id: str) -> list[int]:
        return [t for turn in self.path(turn_id) for t in self.tokens[turn]]

    def predict_error(self, request: Request) -> type[SessionError] | None:
        """The error the store must raise for `request` (not an idempotent replay), or None,
        checked in the same order as the Lua scripts."""
        op, kw = request
        if kw["expected_version"] is not None and kw["expected_version"] != self.version:
            return VersionConflict
        if op == "fork":
            if kw["new_branch"] in self.branches:
                return BranchExists
            return None if kw["from_turn_id"] in self.parent else TurnNotFound
        if kw["branch"] not in self.branches:
            return BranchNotFound
        head = self.branches[kw["branch"]]
        head_moved = kw["expected_head"] is not None and kw["expected_head"] != head
        if op == "rewind":
            if head_moved:
                return HeadMoved
            if kw["to_turn_id"] not in self.parent:
                return TurnNotFound
            return None if kw["to_turn_id"] in self.path(head) else InvalidTreeOperation
        # An append names its parent before the head check: a fork on conflict needs the parent.
        parent = kw["parent_turn_id"] or head
        if parent not in self.parent:
            return TurnNotFound
        if head_moved:
            return HeadMoved
        if kw["move_branch"] and head not in self.path(parent):
            return HeadMoved  # not a fast-forward
        return None

    def apply(self, request: Request, result: Any) -> None:
        """Apply a successful `request` (version already bumped), checking the store's result."""
        op, kw = request
        if op == "append":
            parent = kw["parent_turn_id"] or self.branches[kw["branch"]]
            assert len(result) == len(kw["turns"])
            for turn, new in zip(result, kw["turns"], strict=True):
                assert (turn.parent_id, turn.version) == (parent, self.version)
                assert turn.token_ids == tuple(new.token_ids) and turn.role == new.role
                self.parent[turn.id], self.tokens[turn.id] = parent, turn.token_ids
                self.order.append(turn.id)
                parent = turn.id
            if kw["move_branch"]:
                self.branches[kw["branch"]] = parent
            return
        if op == "fork":
            self.branches[kw["new_branch"]] = kw["from_turn_id"]
        else:
            self.branches[kw["branch"]] = kw["to_turn_id"]
        assert (result.version, dict(result.branches)) == (self.version, self.branches)
