"""Branch leases from the gateway's side: renewed while a turn generates, given back when it
fails, and given back later when the store was down at that moment.

A lease that cannot be released (the store is restarting) would otherwise hold its branch for
its whole TTL, so the client's retry of the failed turn would meet `branch_busy` on a branch
nothing runs on. The keeper remembers such leases: a background task releases each once the
store answers, and `settle` releases a session's leases before its next turn begins, so a retry
through this gateway never waits on them. A lease of a gateway that died lapses after its TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from gateway.errors import is_store_outage
from gateway.store_retry import through_store_outage
from sessions import SessionStore
from sessions.turn_commit import TurnStart

LEASE_TTL_S = 30.0  # renewed every third of it while the turn generates


class LeaseKeeper:
    """The leases of one gateway's turns. Not thread-safe: one event loop."""

    def __init__(self, store: SessionStore, ttl_s: float = LEASE_TTL_S) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._pending: dict[str, dict[str, str | None]] = {}  # session id → lease id → branch
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def num_pending(self) -> int:
        """Leases waiting for the store to come back."""
        return sum(len(leases) for leases in self._pending.values())

    async def begin(self, session_id: str, *, tenant: str, lease_id: str, branch: str | None,
                    parent_turn_id: str | None, expected_version: int | None,
                    fork_branch: str | None) -> TurnStart:
        """`begin_turn` (its errors) after releasing the session's leases left by failed turns.
        When the store goes down during the call, the lease it may have taken is released
        later."""
        await self.settle(session_id)
        try:
            return await self.store.turns.begin_turn(
                session_id, tenant=tenant, lease_id=lease_id, lease_ttl_s=self.ttl_s,
                branch=branch, parent_turn_id=parent_turn_id,
                expected_version=expected_version, fork_branch=fork_branch)
        except Exception as exc:
            if is_store_outage(exc):  # the script may have run before the answer was lost
                await self.release_id(session_id, lease_id, None)
            raise

    @contextlib.contextmanager
    def renewing(self, start: TurnStart) -> Iterator[None]:
        """Renew the turn's lease in the background while the body runs."""
        task = asyncio.get_running_loop().create_task(self._renew(start))
        try:
            yield
        finally:
            task.cancel()

    async def release(self, start: TurnStart) -> None:
        """Give the turn's branch back; never raises. When the store is down, the release is
        remembered and retried."""
        if start.branch is not None:
            await self.release_id(start.session.id, start.lease_id, start.branch)

    async def release_id(self, session_id: str, lease_id: str, branch: str | None) -> None:
        """Release `lease_id` (on `branch`, or wherever it is held when None); never raises."""
        try:
            await asyncio.shield(self.store.turns.release_lease_id(session_id, lease_id, branch))
        except Exception as exc:
            if is_store_outage(exc):
                self._remember(session_id, lease_id, branch)

    async def settle(self, session_id: str) -> None:
        """Release the session's remembered leases now. Raises the store's outage error when it
        is still down (the turn about to begin would meet it anyway)."""
        for lease_id, branch in list(self._pending.get(session_id, {}).items()):
            await self.store.turns.release_lease_id(session_id, lease_id, branch)
            self._forget(session_id, lease_id)

    async def aclose(self) -> None:
        """Stop the background releases (their leases lapse on their own)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _remember(self, session_id: str, lease_id: str, branch: str | None) -> None:
        self._pending.setdefault(session_id, {})[lease_id] = branch
        task = asyncio.get_running_loop().create_task(self._release_later(session_id, lease_id,
                                                                          branch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget(self, session_id: str, lease_id: str) -> None:
        leases = self._pending.get(session_id, {})
        leases.pop(lease_id, None)
        if not leases:
            self._pending.pop(session_id, None)

    async def _release_later(self, session_id: str, lease_id: str, branch: str | None) -> None:
        with contextlib.suppress(Exception):  # past the TTL the lease has lapsed anyway
            await through_store_outage(
                lambda: self.store.turns.release_lease_id(session_id, lease_id, branch),
                wait_s=self.ttl_s)
        self._forget(session_id, lease_id)

    async def _renew(self, start: TurnStart) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            with contextlib.suppress(Exception):  # a missed renewal only risks a fork
                await self.store.turns.renew_lease(start, self.ttl_s)
