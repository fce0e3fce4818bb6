"""What the gateway adds to time-to-first-token, and how fast the session store is.

    python -m benchmarks.gateway_overhead --json bench-results/gateway_overhead.json [--quick]

The gateway runs in a real uvicorn on a free port (a thread with its own event loop) with an
in-process engine on the real model and the real Redis ($RADIXGATE_REDIS_URL, default
127.0.0.1:6379) under a key prefix of its own, deleted afterwards. A multi-turn session streams
each turn; per turn, client TTFT is POST → first `text_delta` event and engine TTFT is the
engine's arrival → first token (`timings` of `turn_end`); their difference is the gateway's
overhead (HTTP, auth, Redis reads and the input-turn write, rendering, SSE). Then each store
operation runs back to back against `SessionStore` for a few seconds (one client, so ops/s is
1 / latency). Prints the tables, writes JSON and a PNG plot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import redis
import torch
from redis.asyncio import Redis

from benchmarks.common import (
    THREADS,
    finish_notes,
    format_table,
    log,
    machine_notes,
    plot_path,
    write_json,
)
from engine.models.loader import LoadedModel, load_model
from gateway.local_server import serve_local
from gateway.settings import GatewaySettings
from sessions import NewTurn, SessionStore

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
TENANT = "bench"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def live_gateway(loaded: LoadedModel, settings: GatewaySettings) -> AbstractContextManager[str]:
    """Serve the gateway on a free loopback port in a thread; yield its base URL."""
    return serve_local(loaded, settings, model_name="smollm2-135m", kv_memory_bytes=1 << 30)


def streamed_turn(http: httpx.Client, sid: str, text: str, max_tokens: int) -> dict[str, Any]:
    """POST one streamed turn; return client TTFT, the engine's timings and the usage."""
    body = {"messages": [{"role": "user", "content": text}],
            "generate": {"max_tokens": max_tokens, "stream": True}}
    started = time.perf_counter()
    client_ttft: float | None = None
    end: dict[str, Any] | None = None
    with http.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
        r.raise_for_status()
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
                if event == "text_delta" and client_ttft is None:
                    client_ttft = time.perf_counter() - started
            elif line.startswith("data: ") and event in ("turn_end", "error"):
                end = json.loads(line.removeprefix("data: "))
                if event == "error":
                    raise RuntimeError(f"turn failed: {end}")
    assert end is not None and client_ttft is not None, "no turn_end or no text_delta"
    total = time.perf_counter() - started
    timings = end.get("timings")
    if not timings:
        raise RuntimeError("turn_end carries no engine timings")
    usage = end["turn"]["usage"]
    return {"client_ttft_s": client_ttft, "engine_ttft_s": timings["ttft_s"],
            "overhead_s": client_ttft - timings["ttft_s"], "total_s": total,
            "input_tokens": usage["input_tokens"], "cached_tokens": usage["cached_tokens"],
            "computed_tokens": usage["computed_tokens"], "output_tokens": usage["output_tokens"]}


def run_session(base_url: str, num_turns: int, max_tokens: int) -> list[dict[str, Any]]:
    rows = []
    with httpx.Client(base_url=base_url, timeout=120) as http:
        warm = http.post("/v1/sessions", json={}).json()["id"]
        streamed_turn(http, warm, "warm-up", 2)  # first-call costs stay out of the timings
        sid = http.post("/v1/sessions", json={"system": "You are a terse assistant."}).json()["id"]
        for i in range(num_turns):
            text = f"Step {i}: list two files to read next and say why, briefly."
            row = {"turn": i, **streamed_turn(http, sid, text, max_tokens)}
            log(f"turn {i:2d}: client TTFT {row['client_ttft_s'] * 1e3:.1f} ms, engine "
                f"{row['engine_ttft_s'] * 1e3:.1f} ms, overhead {row['overhead_s'] * 1e3:.1f} ms")
            rows.append(row)
    return rows


async def _rate(name: str, seconds: float, op: Callable[[], Awaitable[object]]) -> dict[str, Any]:
    count, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        await op()
        count += 1
    log(f"store {name}: {count / elapsed:.0f} ops/s")
    return {"op": name, "ops": count, "seconds": elapsed, "ops_per_s": count / elapsed}


async def store_rates(redis_url: str, prefix: str, seconds: float) -> list[dict[str, Any]]:
    """Back-to-back ops per second of each store operation, one client."""
    client = Redis.from_url(redis_url)
    store = SessionStore(client, key_prefix=prefix)
    system = list(range(1, 65))
    turn = NewTurn(role="user", token_ids=list(range(100, 228)),
                   messages=[{"role": "user", "content": "x" * 200}])
    try:
        # A 24-turn session (root + 24 turns of 128 tokens) for the reads.
        deep = await store.create_session(TENANT, "m", system_token_ids=system)
        for _ in range(24):
            (head,) = await store.append_turns(deep.id, tenant=TENANT, turns=[turn])
        grow = await store.create_session(TENANT, "m", system_token_ids=system)
        return [
            await _rate("create_session", seconds, lambda: store.create_session(
                TENANT, "m", system_token_ids=system)),
            await _rate("append_turns", seconds, lambda: store.append_turns(
                grow.id, tenant=TENANT, turns=[turn])),
            await _rate("get_session", seconds, lambda: store.get_session(
                deep.id, tenant=TENANT)),
            await _rate("token_path (depth 24)", seconds, lambda: store.token_path(
                deep.id, head.id, tenant=TENANT)),
        ]
    finally:
        await client.aclose()


def delete_prefix(redis_url: str, prefix: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        stale = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(stale), 500):
            client.unlink(*stale[start : start + 500])
        return len(stale)
    finally:
        client.close()


def summarise(result: dict[str, Any]) -> None:
    ms = 1e3
    print("\nGateway TTFT overhead per streamed turn (ms)")
    print(format_table(
        ["turn", "input", "cached", "computed", "client ttft", "engine ttft", "overhead"],
        [[r["turn"], r["input_tokens"], r["cached_tokens"], r["computed_tokens"],
          r["client_ttft_s"] * ms, r["engine_ttft_s"] * ms, r["overhead_s"] * ms]
         for r in result["turns"]]))
    o = result["overhead_ms"]
    print(f"\ngateway TTFT - engine TTFT: p50 {o['p50']:.2f} ms, p99 {o['p99']:.2f} ms, "
          f"mean {o['mean']:.2f} ms over {o['n']} turns")
    print("\nSession store, one client back to back")
    print(format_table(["operation", "ops", "seconds", "ops/s", "latency ms"],
                       [[r["op"], r["ops"], r["seconds"], r["ops_per_s"],
                         1e3 / r["ops_per_s"]] for r in result["store"]]))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    turns = result["turns"]
    x = [r["turn"] for r in turns]
    for column, label in (("client_ttft_s", "client TTFT (HTTP, first text_delta)"),
                          ("engine_ttft_s", "engine TTFT"), ("overhead_s", "gateway overhead")):
        ax1.plot(x, [r[column] * 1e3 for r in turns], marker="o", markersize=3, label=label)
    o = result["overhead_ms"]
    ax1.set(xlabel="turn", ylabel="ms", title=f"TTFT per turn: overhead p50 {o['p50']:.1f} ms, "
            f"p99 {o['p99']:.1f} ms")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    store = result["store"]
    ax2.barh([r["op"] for r in store], [r["ops_per_s"] for r in store])
    ax2.set(xlabel="ops/s (one client)", title="SessionStore operations")
    ax2.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=Path("bench-results/gateway_overhead.json"))
    parser.add_argument("--quick", action="store_true", help="fewer turns, shorter store runs")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--store-seconds", type=float, default=None)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    num_turns = args.turns or 12
    seconds = args.store_seconds or (1.0 if args.quick else 3.0)
    redis_url = os.environ.get("RADIXGATE_REDIS_URL", DEFAULT_REDIS_URL)
    prefix = f"bench:{uuid.uuid4().hex}:"
    loaded = load_model(None)
    notes = machine_notes(loaded.path)
    settings = GatewaySettings(redis_url=redis_url, key_prefix=prefix)
    try:
        with live_gateway(loaded, settings) as base_url:
            turns = run_session(base_url, num_turns, args.max_tokens)
        store = asyncio.run(store_rates(redis_url, prefix, seconds))
    finally:
        log(f"deleted {delete_prefix(redis_url, prefix)} benchmark keys")
    finish_notes(notes)
    overhead = [r["overhead_s"] * 1e3 for r in turns]
    result = {"notes": notes, "redis_url": redis_url, "max_tokens": args.max_tokens,
              "turns": turns, "store": store,
              "overhead_ms": {"p50": percentile(overhead, 50), "p99": percentile(overhead, 99),
                              "mean": statistics.fmean(overhead), "n": len(overhead)}}
    summarise(result)
    write_json(args.json, result)
    plot(result, plot_path(args.json))


if __name__ == "__main__":
    main()
