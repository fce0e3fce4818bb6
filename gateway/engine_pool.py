"""The engine workers a gateway routes turns to, and how one is picked for a turn.

    1. bound         the worker that generated the parent turn (its id is stored on the turn in
                     Redis, so every gateway replica routes a session's turns the same way), if
                     it is up
    2. prefix        else the worker whose cache holds the longest prefix of the turn's token
                     path (a read-only `PrefixProbe` to each live worker), unless it is busier
                     than the least loaded by more than `balance_slack` requests
    3. least_loaded  else the least loaded (requests running and waiting there, plus this
                     gateway's own in flight)

With one worker every turn goes to it without a probe: the single-worker path costs nothing
extra. A worker that restarts comes back with a new id (its KV is gone), so turns bound to the
old id are routed as in 2-3, and the ledger's token path re-prefills them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from engine.errors import EngineError
from engine.protocol import PrefixMatch, Stats
from gateway.engine_link import EngineLink
from gateway.errors import EngineUnavailable

PROBE_TIMEOUT_S = 2.0
Path = Callable[[], Awaitable[tuple[str, list[int]]]]  # (namespace, token ids) of the turn


@dataclass(frozen=True)
class Route:
    link: EngineLink
    reason: str  # "only" | "bound" | "prefix" | "least_loaded"
    cached_len: int = 0  # what the probe found cached there (reason "prefix")


class EnginePool:
    """The gateway's engine links, in a fixed order. `route_counts` counts the reasons."""

    def __init__(self, links: Sequence[EngineLink], *, balance_slack: int = 4) -> None:
        if not links:
            raise ValueError("an engine pool needs at least one worker")
        self.links = list(links)
        self.balance_slack = balance_slack
        self.route_counts: Counter[str] = Counter()
        self.on_route: Callable[[str], None] | None = None  # the app's metrics

    @property
    def primary(self) -> EngineLink:
        return self.links[0]

    def __len__(self) -> int:
        return len(self.links)

    async def identify(self, timeout_s: float = 10.0) -> list[Stats]:
        """Ask every worker for its stats (and so its id). Raises TimeoutError, EngineError."""
        stats = await asyncio.gather(*(link.client.stats(timeout_s) for link in self.links))
        for link, s in zip(self.links, stats, strict=True):
            link.worker_id = s.worker_id
        return list(stats)

    def by_worker(self, worker_id: str | None) -> EngineLink | None:
        if not worker_id:
            return None
        return next((link for link in self.links if link.worker_id == worker_id), None)

    async def route(self, bound: str | None, path: Path) -> Route:
        """The worker for a turn whose parent was generated on `bound` (None: unknown); `path`
        gives the turn's namespace and token ids for the probe. Raises EngineUnavailable when
        no worker is up (after the single worker's restart wait)."""
        if len(self.links) == 1:
            return self._count(Route(self.links[0], "only"))
        link = self.by_worker(bound)
        if link is not None and link.is_up:
            return self._count(Route(link, "bound"))
        up = [link for link in self.links if link.is_up]
        if not up:
            await self.primary.live()  # waits for a restart, or raises EngineUnavailable
            up = [self.primary]
        namespace, token_ids = await path()
        matches = await asyncio.gather(*(_probe(link, namespace, token_ids) for link in up))
        live = [(link, m) for link, m in zip(up, matches, strict=True) if m is not None]
        if not live:
            raise EngineUnavailable("no engine worker answered")
        for link, match in live:
            link.worker_id = match.worker_id  # a restarted worker's new id
        min_load = min(_load(link, m) for link, m in live)
        near = [(link, m) for link, m in live if _load(link, m) <= min_load + self.balance_slack]
        link, match = max(near, key=lambda lm: (lm[1].cached_len, -_load(*lm)))
        if match.cached_len > 0:
            return self._count(Route(link, "prefix", match.cached_len))
        link, match = min(live, key=lambda lm: _load(*lm))
        return self._count(Route(link, "least_loaded"))

    def failover(self, lost: EngineLink) -> EngineLink | None:
        """Another worker that is up, least loaded first, for a turn whose worker died."""
        others = [link for link in self.links if link is not lost and link.is_up]
        return min(others, key=lambda link: link.client.num_in_flight, default=None)

    async def pin(self, worker_id: str | None, ref: str, ttl_s: float) -> None:
        """Pin `ref` where it is bound (every worker when its worker is unknown)."""
        for link in self._holders(worker_id):
            await link.pin(ref, ttl_s)

    async def unpin(self, worker_id: str | None, ref: str) -> None:
        for link in self._holders(worker_id):
            await link.unpin(ref)

    async def stats(self, timeout_s: float) -> list[Stats | None]:
        """Each worker's stats now; None for one that does not answer."""
        async def one(link: EngineLink) -> Stats | None:
            try:
                return await link.client.stats(timeout_s=timeout_s)
            except (EngineError, TimeoutError):
                return None
        return list(await asyncio.gather(*(one(link) for link in self.links)))

    async def close(self) -> None:
        for link in self.links:
            await link.close()

    def _holders(self, worker_id: str | None) -> list[EngineLink]:
        link = self.by_worker(worker_id)
        return [link] if link is not None else self.links

    def _count(self, route: Route) -> Route:
        self.route_counts[route.reason] += 1
        if self.on_route is not None:
            self.on_route(route.reason)
        return route


async def _probe(link: EngineLink, namespace: str, token_ids: list[int]) -> PrefixMatch | None:
    try:
        return await link.client.probe(namespace, token_ids, timeout_s=PROBE_TIMEOUT_S)
    except (EngineError, TimeoutError):
        return None


def _load(link: EngineLink, match: PrefixMatch) -> int:
    # The engine's count lags requests this gateway has just sent; its own count fills the gap
    # (counting some twice, alike on every worker).
    return match.num_running + match.num_waiting + link.client.num_in_flight


def combine_stats(stats: Sequence[Stats]) -> Stats:
    """One Stats over several workers: counts summed, the first's model and page size, the
    smallest context length."""
    first = stats[0]
    summed: dict[str, Any] = {f.name: sum(getattr(s, f.name) for s in stats)
                              for f in fields(Stats)
                              if f.type in ("int", int) and f.name not in ("page_size",
                                                                           "context_len")}
    summed["context_len"] = min(s.context_len for s in stats)
    return Stats(**{**{f.name: getattr(first, f.name) for f in fields(Stats)}, **summed,
                    "worker_id": ",".join(s.worker_id for s in stats)})
