"""`TurnHistory`: per-minute buckets over the last hour, percentiles, expiry and the bound."""

from __future__ import annotations

from observability.turn_history import TurnHistory, TurnRecord, percentile

NOW_MS = 10_000_000_000


def _record(age_s: float, *, worker: str = "w0", ttft_ms: float | None = 100.0,
            input_tokens: int = 100, cached: int = 90, output: int = 10) -> TurnRecord:
    return TurnRecord(finished_ms=NOW_MS - int(age_s * 1000), worker=worker, ttft_ms=ttft_ms,
                      input_tokens=input_tokens, cached_tokens=cached, output_tokens=output)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, q) for q in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    assert percentile([7.0], 99) == 7.0


def test_buckets_place_each_turn_in_its_minute_and_sum_per_worker() -> None:
    history = TurnHistory()
    history.record(_record(3599, output=60))  # the oldest minute
    history.record(_record(30, worker="w0", ttft_ms=10.0, output=120))
    history.record(_record(20, worker="w1", ttft_ms=30.0, cached=0, output=60))
    history.record(_record(0.5, ttft_ms=None, output=0))  # nothing generated: no TTFT
    got = history.overview(now_ms=NOW_MS)
    buckets = got["buckets"]
    assert len(buckets) == 60 and buckets[-1]["start_ms"] == NOW_MS - 60_000
    assert buckets[0]["num_turns"] == 1 and buckets[-1]["num_turns"] == 3
    assert sum(b["num_turns"] for b in buckets[1:-1]) == 0
    last = buckets[-1]
    assert last["hit_rate"] == round(180 / 300, 4)
    assert last["ttft_ms"] == {"p50": 10.0, "p90": 30.0, "p99": 30.0}
    assert last["tokens_per_s"] == {"w0": 2.0, "w1": 1.0}
    assert buckets[1]["hit_rate"] is None and buckets[1]["ttft_ms"] is None
    assert got["totals"]["num_turns"] == 4
    assert got["totals"]["tokens_per_s"] == {"w0": round(180 / 3600, 3),
                                             "w1": round(60 / 3600, 3)}


def test_old_turns_expire_and_the_count_is_bounded() -> None:
    history = TurnHistory(max_records=3)
    history.record(_record(4000))
    history.record(_record(10))
    assert history.overview(now_ms=NOW_MS)["totals"]["num_turns"] == 1  # 4000 s ago: gone
    for _ in range(5):
        history.record(_record(5))
    assert history.overview(now_ms=NOW_MS)["totals"]["num_turns"] == 3
    short = history.overview(now_ms=NOW_MS, window_s=120, bucket_s=10)
    assert len(short["buckets"]) == 12 and short["totals"]["num_turns"] == 3
