"""Generation as it happens, for the session event stream (`/v1/sessions/{id}/events`).

The store's event stream says when turns land; what a turn is writing before it lands exists
only on the gateway that runs it. `LiveTurns` fans those events out to this gateway's event
stream readers of the session: `generation.started`, `generation.delta` (text) and
`generation.ended`, and `session.deleted` when a delete passes here. Delivery is best effort: a
reader whose queue is full misses deltas (it still sees the turn land through the store), and a
reader on another gateway replica sees landed turns only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

QUEUE_LEN = 1024  # events a slow reader may fall behind by before deltas are dropped


class LiveTurns:
    """Subscribers per session id. Session ids are unguessable and the event route checks the
    tenant before subscribing, so the id alone is the key."""

    def __init__(self) -> None:
        self._readers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = {}

    @contextmanager
    def subscribe(self, session_id: str) -> Iterator[asyncio.Queue[dict[str, Any]]]:
        """A queue receiving the session's live events until the block exits."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_LEN)
        self._readers.setdefault(session_id, set()).add(queue)
        try:
            yield queue
        finally:
            readers = self._readers.get(session_id)
            if readers is not None:
                readers.discard(queue)
                if not readers:
                    del self._readers[session_id]

    def watched(self, session_id: str) -> bool:
        return session_id in self._readers

    def publish(self, session_id: str, event: dict[str, Any]) -> None:
        """Hand `event` (a JSON object with "type") to every reader of the session; never
        blocks. A full queue drops it."""
        for queue in self._readers.get(session_id, ()):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                pass
