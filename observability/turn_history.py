"""The last hour of finished turns, in memory, for the overview page (`GET /v1/ui/overview`).

Prometheus counters say what happened since start; a person opening the page wants the last
hour without running a Prometheus. `TurnHistory` keeps one small record per finished engine
request (bounded in count and age) and folds them into per-minute buckets on request: prefix
cache hit rate, TTFT percentiles and output tokens/s per engine worker.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

WINDOW_S = 3600
BUCKET_S = 60
MAX_RECORDS = 200_000  # about 10 MB; a gateway finishing 55 turns/s for an hour


@dataclass(frozen=True, slots=True)
class TurnRecord:
    finished_ms: int
    worker: str  # the engine worker that ran it ("" when unknown)
    ttft_ms: float | None  # None: nothing was generated (no first token)
    input_tokens: int
    cached_tokens: int
    output_tokens: int


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty ascending list (q in 0..100)."""
    rank = max(math.ceil(q / 100 * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def _ttft(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    values.sort()
    return {f"p{q}": round(percentile(values, q), 2) for q in (50, 90, 99)}


def _summary(records: list[TurnRecord], span_s: float) -> dict[str, Any]:
    input_tokens = sum(r.input_tokens for r in records)
    cached = sum(r.cached_tokens for r in records)
    per_worker: dict[str, int] = {}
    for r in records:
        per_worker[r.worker] = per_worker.get(r.worker, 0) + r.output_tokens
    return {
        "num_turns": len(records), "input_tokens": input_tokens, "cached_tokens": cached,
        "output_tokens": sum(r.output_tokens for r in records),
        "hit_rate": round(cached / input_tokens, 4) if input_tokens else None,
        "ttft_ms": _ttft([r.ttft_ms for r in records if r.ttft_ms is not None]),
        "tokens_per_s": {w: round(n / span_s, 3) for w, n in sorted(per_worker.items())},
    }


class TurnHistory:
    """Finished turns of the last `WINDOW_S` seconds (at most `MAX_RECORDS`), oldest first."""

    def __init__(self, *, max_records: int = MAX_RECORDS) -> None:
        self._records: deque[TurnRecord] = deque(maxlen=max_records)

    def record(self, record: TurnRecord) -> None:
        self._records.append(record)
        self._expire(record.finished_ms)

    def _expire(self, now_ms: int) -> None:
        oldest = now_ms - WINDOW_S * 1000
        while self._records and self._records[0].finished_ms < oldest:
            self._records.popleft()

    def overview(self, *, window_s: int = WINDOW_S, bucket_s: int = BUCKET_S,
                 now_ms: int | None = None) -> dict[str, Any]:
        """Per-bucket and whole-window summaries of the turns finished in the last `window_s`
        (≤ WINDOW_S) seconds: buckets oldest first, each `bucket_s` long, the last one ending
        at `now_ms`; tokens/s is a bucket's output tokens over its length."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        window_s = min(window_s, WINDOW_S)
        self._expire(now_ms)
        num_buckets = max(math.ceil(window_s / bucket_s), 1)
        start_ms = now_ms - num_buckets * bucket_s * 1000
        grouped: list[list[TurnRecord]] = [[] for _ in range(num_buckets)]
        for r in self._records:
            if start_ms < r.finished_ms <= now_ms:
                index = min((r.finished_ms - start_ms - 1) // (bucket_s * 1000), num_buckets - 1)
                grouped[index].append(r)
        buckets = [{"start_ms": start_ms + n * bucket_s * 1000, **_summary(group, bucket_s)}
                   for n, group in enumerate(grouped)]
        everything = [r for group in grouped for r in group]
        return {"window_s": window_s, "bucket_s": bucket_s, "now_ms": now_ms,
                "buckets": buckets, "totals": _summary(everything, num_buckets * bucket_s)}
