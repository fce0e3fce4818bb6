"""Session store error types. The gateway maps each `error_type` to an HTTP status in one place.

Suggested mapping (the gateway owns it): the three `*NotFound` → 404, `BranchExists` and
`HeadMoved` → 409, `VersionConflict` → 412, `IdempotencyConflict` → 422,
`InvalidTreeOperation` → 400, `StoreCorruption` → 500.
"""

from __future__ import annotations


class SessionError(Exception):
    """Root of every error the session store raises on purpose."""

    error_type = "session_error"


class NotFoundError(SessionError):
    """Something addressed by id does not exist (or belongs to another tenant)."""

    error_type = "not_found"


class SessionNotFound(NotFoundError):
    """No such session, or it belongs to another tenant (never reveal which)."""

    error_type = "session_not_found"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found")
        self.session_id = session_id


class TurnNotFound(NotFoundError):
    """No turn with this id in the session."""

    error_type = "turn_not_found"

    def __init__(self, session_id: str, turn_id: str) -> None:
        super().__init__(f"turn {turn_id!r} not found in session {session_id!r}")
        self.session_id = session_id
        self.turn_id = turn_id


class BranchNotFound(NotFoundError):
    """No branch with this name in the session."""

    error_type = "branch_not_found"

    def __init__(self, session_id: str, branch: str) -> None:
        super().__init__(f"branch {branch!r} not found in session {session_id!r}")
        self.session_id = session_id
        self.branch = branch


class ConflictError(SessionError):
    """The request contradicts the current state of the tree; the client may rebase and retry."""

    error_type = "conflict"


class BranchExists(ConflictError):
    """`fork` named a branch that already exists."""

    error_type = "branch_exists"

    def __init__(self, session_id: str, branch: str) -> None:
        super().__init__(f"branch {branch!r} already exists in session {session_id!r}")
        self.session_id = session_id
        self.branch = branch


class HeadMoved(ConflictError):
    """The branch head is not what the caller expected, or an append would not fast-forward it.

    `current_head` and `version` describe the branch as the store saw it, so the caller can rebase.
    """

    error_type = "head_moved"

    def __init__(
        self, session_id: str, branch: str, current_head: str, version: int, reason: str
    ) -> None:
        super().__init__(
            f"branch {branch!r} of session {session_id!r} is at {current_head!r} "
            f"(version {version}): {reason}"
        )
        self.session_id = session_id
        self.branch = branch
        self.current_head = current_head
        self.version = version


class BranchBusy(ConflictError):
    """Another turn is being generated on the branch; its reply will move the head."""

    error_type = "branch_busy"

    def __init__(self, session_id: str, branch: str) -> None:
        super().__init__(
            f"branch {branch!r} of session {session_id!r} has a turn in progress; wait for it "
            "(the head then moves), or fork a branch"
        )
        self.session_id = session_id
        self.branch = branch


class VersionConflict(SessionError):
    """`expected_version` (an If-Match ETag) differs from the session's current version."""

    error_type = "version_conflict"

    def __init__(self, session_id: str, expected: int, current: int) -> None:
        super().__init__(
            f"session {session_id!r} is at version {current}, request expected {expected}"
        )
        self.session_id = session_id
        self.expected = expected
        self.current = current


class IdempotencyConflict(SessionError):
    """An idempotency key was reused with a different request body."""

    error_type = "idempotency_conflict"

    def __init__(self, session_id: str | None) -> None:
        where = f" in session {session_id!r}" if session_id else ""
        super().__init__(f"idempotency key reused{where} with a different request")
        self.session_id = session_id


class InvalidTreeOperation(SessionError):
    """The operation is malformed or not allowed on this tree (bad name, rewind to non-ancestor)."""

    error_type = "invalid_tree_operation"


class StoreCorruption(SessionError):
    """Stored data breaks an invariant (missing parent, cycle). A bug or external tampering."""

    error_type = "store_corruption"
