"""Load shedding under overload: offered load at 4x the sustainable session rate, with and
without `--max-queue-wait`.

    python -m benchmarks.load_shedding --json bench-results/load_shedding.json \
        [--bound 2 --overload 4 --duration 40]

`radixgate serve` runs as a real process (embedded Valkey) on the real model. A session here is
an agent's first turn: create a session with a shared system prompt, then one streamed turn
with a unique task (`max_tokens` 24). First the sustainable rate is measured: `--clients`
closed-loop clients for `--capacity-s` seconds, sessions finished per second. Then sessions
arrive open-loop (Poisson) at `--overload` times that rate for `--duration` seconds, once on a
server with no bound and once with `--max-queue-wait BOUND`. Every client has a timeout
(`--client-timeout`). Counted per run: turns admitted and finished, refusals by status and type,
client timeouts, other failures, and the admitted turns' TTFT (request sent to first text
event) p50/p99/max. Prints a table, writes JSON and a PNG of TTFT against arrival time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import finish_notes, format_table, log, machine_notes, publish
from benchmarks.serve_process import ServeProcess
from engine.models.locate import embedded_gguf_path

SYSTEM = ("You are a coding agent working in a Python repository. Read the task, decide which "
          "file to open, and answer with the next command to run. Keep answers short. " * 3)
MAX_TOKENS = 24


async def one_session(client: httpx.AsyncClient, index: int, timeout_s: float
                      ) -> dict[str, Any]:
    """Create a session and stream its first turn. Returns outcome, TTFT and status."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            r = await client.post("/v1/sessions", json={"system": SYSTEM})
            r.raise_for_status()
            sid = r.json()["id"]
            task = (f"Task {index}: the test test_parse_{index} fails with KeyError "
                    f"'{index % 97}'. What do you run first?")
            sent = time.perf_counter()
            first: float | None = None
            async with client.stream("POST", f"/v1/sessions/{sid}/turns", json={
                    "messages": [{"role": "user", "content": task}],
                    "generate": {"max_tokens": MAX_TOKENS, "temperature": 0,
                                 "stream": True}}) as s:
                if s.status_code != 200:
                    body = (await s.aread()).decode()
                    kind = _error_type(body)
                    return {"outcome": "refused", "status": s.status_code, "type": kind,
                            "retry_after": s.headers.get("retry-after"),
                            "t": started, "ttft_s": None}
                engine: dict[str, Any] = {}
                async for line in s.aiter_lines():
                    if first is None and line.startswith("event: text"):
                        first = time.perf_counter() - sent
                    if line.startswith("event: error"):
                        return {"outcome": "failed", "status": 200, "type": "stream_error",
                                "t": started, "ttft_s": first}
                    if line.startswith("data: ") and '"turn_end"' in line:
                        engine = json.loads(line[6:]).get("timings") or {}
            return {"outcome": "ok", "status": 200, "type": None, "t": started,
                    "ttft_s": first if first is not None else time.perf_counter() - sent,
                    "engine_ttft_s": engine.get("ttft_s"), "engine_queue_s": engine.get("queue_s")}
    except TimeoutError:
        return {"outcome": "timeout", "status": None, "type": None, "t": started,
                "ttft_s": None}
    except httpx.HTTPError as exc:
        return {"outcome": "failed", "status": None, "type": type(exc).__name__,
                "t": started, "ttft_s": None}


def _error_type(body: str) -> str:
    try:
        return str(json.loads(body)["error"]["type"])
    except (ValueError, KeyError, TypeError):
        return "unparsed"


async def capacity(url: str, num_clients: int, seconds: float, timeout_s: float) -> float:
    """Sessions per second that `num_clients` closed-loop clients finish within `seconds`
    (after one warm-up session)."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        await one_session(client, 9_999, timeout_s)
        started = time.perf_counter()
        deadline = started + seconds
        finished: list[float] = []

        async def loop(c: int) -> None:
            n = 0
            while time.perf_counter() < deadline:
                result = await one_session(client, 10_000 * (c + 1) + n, timeout_s)
                n += 1
                if result["outcome"] == "ok":
                    finished.append(time.perf_counter())
        await asyncio.gather(*(loop(c) for c in range(num_clients)))
        return sum(t <= deadline for t in finished) / seconds


async def offered(url: str, rate: float, seconds: float, timeout_s: float,
                  seed: int) -> list[dict[str, Any]]:
    """Open-loop Poisson arrivals at `rate` sessions/s for `seconds`; every session's result."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        tasks: list[asyncio.Task[dict[str, Any]]] = []
        origin = time.perf_counter()
        at = 0.0
        index = 0
        while at < seconds:
            await asyncio.sleep(max(0.0, origin + at - time.perf_counter()))
            tasks.append(asyncio.create_task(one_session(client, index, timeout_s)))
            index += 1
            at += rng.expovariate(rate)
        results = await asyncio.gather(*tasks)
    for r in results:
        r["t"] -= origin
    return list(results)


def summarize(name: str, results: list[dict[str, Any]], bound: float | None) -> dict[str, Any]:
    ttfts = sorted(r["ttft_s"] for r in results if r["outcome"] == "ok")
    refusals = Counter(f"{r['status']} {r['type']}" for r in results
                       if r["outcome"] == "refused")
    return {"run": name, "bound_s": bound, "offered": len(results), "admitted_ok": len(ttfts),
            "refused": sum(refusals.values()), "refusals": dict(refusals),
            "timeouts": sum(r["outcome"] == "timeout" for r in results),
            "failed": sum(r["outcome"] == "failed" for r in results),
            "ttft_p50_s": _pct(ttfts, 0.5), "ttft_p99_s": _pct(ttfts, 0.99),
            "ttft_max_s": ttfts[-1] if ttfts else None}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for run, color in zip(result["runs"], ("tab:red", "tab:blue"), strict=False):
        points = [(r["t"], r["ttft_s"]) for r in run["results"] if r["outcome"] == "ok"]
        shed = [r["t"] for r in run["results"] if r["outcome"] == "refused"]
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=8, color=color,
                   label=f"{run['summary']['run']}: admitted TTFT")
        if shed:
            ax.scatter(shed, [0] * len(shed), s=8, marker="x", color="gray",
                       label=f"{run['summary']['run']}: refused (503 overloaded)")
    if result["bound_s"]:
        ax.axhline(result["bound_s"], linestyle="--", color="black", label="--max-queue-wait")
    ax.set_xlabel("arrival time (s)")
    ax.set_ylabel("TTFT (s)")
    ax.set_title(f"{result['overload']}x the sustainable rate "
                 f"({result['offered_rate']:.2f} sessions/s offered)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=Path("bench-results/load_shedding.json"))
    parser.add_argument("--bound", type=float, default=2.0, help="--max-queue-wait, seconds")
    parser.add_argument("--overload", type=float, default=4.0)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--capacity-s", type=float, default=30.0)
    parser.add_argument("--client-timeout", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=None,
                        help="offer this many sessions/s (skips measuring the sustainable rate)")
    parser.add_argument("--bound-only", action="store_true", help="skip the run with no bound")
    args = parser.parse_args()
    notes = machine_notes(embedded_gguf_path())
    runs: list[dict[str, Any]] = []
    rate = args.rate or 0.0
    plan = [("no bound", None), (f"bound {args.bound:g} s", args.bound)]
    with tempfile.TemporaryDirectory(prefix="rg-shed-") as tmp:
        for name, bound in plan[1:] if args.bound_only else plan:
            flags = ["--max-queue-wait", str(bound)] if bound is not None else []
            log(f"starting radixgate serve ({name})")
            server = ServeProcess.start(Path(tmp) / name.replace(" ", "-"), *flags)
            try:
                if not rate:
                    log(f"measuring the sustainable rate ({args.clients} closed-loop clients, "
                        f"{args.capacity_s:g} s)")
                    sustainable = asyncio.run(capacity(server.url, args.clients,
                                                       args.capacity_s, args.client_timeout))
                    rate = sustainable * args.overload
                    log(f"sustainable {sustainable:.2f} sessions/s; offering {rate:.2f}/s")
                log(f"offered load for {args.duration:g} s ({name})")
                results = asyncio.run(offered(server.url, rate, args.duration,
                                              args.client_timeout, seed=1))
            finally:
                server.stop()
            runs.append({"summary": summarize(name, results, bound), "results": results})
    finish_notes(notes)
    rows = [[s["run"], s["offered"], s["admitted_ok"], s["refused"],
             ", ".join(f"{k}: {v}" for k, v in s["refusals"].items()) or "-", s["timeouts"],
             s["failed"], s["ttft_p50_s"], s["ttft_p99_s"], s["ttft_max_s"]]
            for s in (r["summary"] for r in runs)]
    table = format_table(["run", "offered", "ok", "refused", "refusals", "timeouts", "failed",
                          "TTFT p50 s", "TTFT p99 s", "TTFT max s"], rows)
    table = (f"offered {rate:.2f} sessions/s = {args.overload:g}x the sustainable "
             f"{rate / args.overload:.2f}/s for {args.duration:g} s; client timeout "
             f"{args.client_timeout:g} s\n" + table)
    result = {"machine": notes, "bound_s": args.bound, "overload": args.overload,
              "offered_rate": rate, "duration_s": args.duration, "runs": runs}
    publish(args.json, result, table, plot)


if __name__ == "__main__":
    main()
