"""Sessions through 1, 2 and 4 engine workers behind one gateway: throughput, TTFT, affinity.

    python -m benchmarks.scale_out --json bench-results/scale_out.json [--quick]

For each worker count a real `radixgate serve --workers N` runs (its own uvicorn, N engine
worker processes with `--threads` each, the real model) over the real Redis
($RADIXGATE_REDIS_URL, default 127.0.0.1:6379) under a key prefix of its own, deleted after.
`--sessions` agent-like sessions run side by side, each `--turns` streamed turns (a shared
system prompt, a few hundred new tokens per turn). Reported per worker count: sessions/s, turns
per second, client TTFT p50/p99 (POST to first text), the affinity hit rate (turns after a
session's first that went to the worker holding their parent, from `radixgate_worker_routes`),
the prefix-cache hit rate, and KV bytes moved between workers (none: routing by affinity moves
no KV; a session whose worker is lost is re-prefilled from the ledger instead).

This machine has 2 cores: more workers than cores share them, so beyond 2 workers the figures
show routing working, not more compute.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.common import (
    THREADS,
    finish_notes,
    format_table,
    log,
    machine_notes,
    publish,
)
from benchmarks.gateway_overhead import percentile
from engine.models.locate import embedded_gguf_path
from gateway.worker import free_port

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
QUERIES = "radixgate_prefix_cache_queries_tokens_total"
HITS = "radixgate_prefix_cache_hits_tokens_total"
SYSTEM = ("You are a coding agent working in a Python repository. Read files, run tests, and "
          "make small careful edits. Answer tersely. ") * 6
TOOL_OUTPUT = ("def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(),"
               " value.strip()\n") * 6


def start_server(num_workers: int, threads: int, redis_url: str, prefix: str,
                 state_dir: Path) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    port = free_port()
    env = {**os.environ, "RADIXGATE_REDIS_URL": redis_url, "RADIXGATE_KEY_PREFIX": prefix}
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--state-dir",
         str(state_dir), "--workers", str(num_workers), "--threads", str(threads),
         "--kv-memory", "256"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("radixgate serve exited")
        try:
            r = http.get("/readyz", timeout=5)
            if r.status_code == 200 and all(w["up"] for w in r.json()["workers"]):
                return process, http
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError("radixgate serve did not become ready")


async def run_session(client: httpx.AsyncClient, index: int, num_turns: int,
                      max_tokens: int) -> list[float]:
    """One session's turns; their client TTFTs."""
    r = await client.post("/v1/sessions", json={"system": SYSTEM})
    r.raise_for_status()
    sid = r.json()["id"]
    ttfts: list[float] = []
    for turn in range(num_turns):
        text = f"Session {index}, step {turn}: the tool printed\n{TOOL_OUTPUT}\nWhat next?"
        started = time.perf_counter()
        first: float | None = None
        async with client.stream("POST", f"/v1/sessions/{sid}/turns", json={
                "messages": [{"role": "user", "content": text}],
                "generate": {"max_tokens": max_tokens, "temperature": 0, "stream": True}}) as s:
            s.raise_for_status()
            async for line in s.aiter_lines():
                if first is None and line.startswith("event: text"):
                    first = time.perf_counter() - started
                if line.startswith("event: error"):
                    raise RuntimeError(f"turn failed in session {sid}")
        ttfts.append(first if first is not None else time.perf_counter() - started)
    return ttfts


def scrape(http: httpx.Client) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("radixgate_worker_routes_total{"):
            values["route_" + line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
        for name in (QUERIES, HITS):
            if line.startswith(name + " "):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values


def run_one(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run; `spec` is "N" (N workers of `--threads` threads) or "NxT"."""
    workers, _, threads = spec.partition("x")
    num_workers, num_threads = int(workers), int(threads or args.threads)
    prefix = f"bench:scale:{uuid.uuid4().hex}:"
    with tempfile.TemporaryDirectory() as state:
        log(f"{num_workers} worker(s) x {num_threads} thread(s): starting serve")
        process, http = start_server(num_workers, num_threads, args.redis_url, prefix,
                                     Path(state))
        try:
            async def drive() -> list[list[float]]:
                async with httpx.AsyncClient(base_url=str(http.base_url), timeout=600) as c:
                    return await asyncio.gather(*(run_session(c, i, args.turns, args.max_tokens)
                                                  for i in range(args.sessions)))
            started = time.perf_counter()
            per_session = asyncio.run(drive())
            wall = time.perf_counter() - started
            metrics = scrape(http)
        finally:
            process.terminate()
            process.wait(60)
            http.close()
            _delete_prefix(args.redis_url, prefix)
    ttfts = [t for session in per_session for t in session]
    routed = sum(v for k, v in metrics.items() if k.startswith("route_"))
    later = routed - args.sessions  # every turn but each session's first has a parent
    bound = metrics.get("route_bound", 0.0)  # one worker: every turn is "only" (no choice)
    queries = metrics.get(QUERIES, 0.0)
    row = {"workers": num_workers, "threads": num_threads, "sessions": args.sessions,
           "turns": len(ttfts), "wall_s": wall, "sessions_per_s": args.sessions / wall,
           "turns_per_s": len(ttfts) / wall,
           "ttft_p50_s": statistics.median(ttfts), "ttft_p99_s": percentile(ttfts, 99),
           "affinity_hit_rate": bound / later if later > 0 and num_workers > 1 else None,
           "prefix_hit_rate": metrics.get(HITS, 0.0) / queries if queries else 0.0,
           "kv_bytes_moved": 0, "routes": metrics}
    log(f"{num_workers} worker(s): {row['sessions_per_s']:.3f} sessions/s, TTFT p50 "
        f"{row['ttft_p50_s'] * 1e3:.0f} ms, affinity {_pct(row['affinity_hit_rate'])}")
    return row


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _delete_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])
    finally:
        client.close()


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    workers = [r["workers"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(workers, [r["sessions_per_s"] for r in rows], marker="o", linestyle="none")
    ax1.set_xlabel("engine workers")
    ax1.set_ylabel("sessions / s")
    ax1.set_xticks(workers)
    ax2.plot(workers, [r["ttft_p50_s"] * 1e3 for r in rows], marker="o", label="TTFT p50")
    ax2.plot(workers, [r["ttft_p99_s"] * 1e3 for r in rows], marker="o", label="TTFT p99")
    ax2.set_xlabel("engine workers")
    ax2.set_ylabel("ms")
    ax2.set_xticks(workers)
    ax2.legend()
    fig.suptitle(f"scale-out on {result['machine'].get('num_cpus', '?')} CPUs "
                 f"({result['sessions']} sessions x {result['turns']} turns)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=Path("bench-results/scale_out.json"))
    parser.add_argument("--workers", default="1x2,1,2,4",
                        help="worker counts, comma-separated; NxT: N workers of T threads")
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per worker where --workers gives none")
    parser.add_argument("--redis-url", default=os.environ.get("RADIXGATE_REDIS_URL",
                                                              DEFAULT_REDIS_URL))
    parser.add_argument("--quick", action="store_true", help="8 sessions x 3 turns")
    args = parser.parse_args()
    args.sessions = args.sessions or (8 if args.quick else 16)
    args.turns = args.turns or (3 if args.quick else 6)
    notes = machine_notes(embedded_gguf_path())
    rows = [run_one(spec, args) for spec in args.workers.split(",")]
    finish_notes(notes)
    # The run loads the machine itself (up to 4 workers): only the load before it counts.
    notes["loaded"] = notes["load_avg_before"] > THREADS + 0.5
    result = {"machine": notes, "sessions": args.sessions, "turns": args.turns,
              "max_tokens": args.max_tokens, "threads_per_worker": args.threads, "rows": rows}
    base = rows[0]["sessions_per_s"]
    table = format_table(
        ["workers", "threads each", "sessions/s", "vs first", "turns/s", "TTFT p50 ms",
         "TTFT p99 ms", "affinity hit", "prefix hit", "KV bytes moved"],
        [[r["workers"], r["threads"], r["sessions_per_s"], r["sessions_per_s"] / base,
          r["turns_per_s"], r["ttft_p50_s"] * 1e3, r["ttft_p99_s"] * 1e3,
          _pct(r["affinity_hit_rate"]), f"{r['prefix_hit_rate']:.1%}", r["kv_bytes_moved"]]
         for r in rows])
    publish(args.json, result, table, plot)


if __name__ == "__main__":
    main()
