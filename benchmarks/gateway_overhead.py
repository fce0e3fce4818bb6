"""What the gateway adds to time-to-first-token on each route, and how fast the session store is.

    python -m benchmarks.gateway_overhead --json bench-results/gateway_overhead.json [--quick]

As under `radixgate serve`, the engine is a worker process (`radixgate engine`, ZeroMQ) and the
gateway a real uvicorn on a free port (a thread of this process), with the real model and the
real Redis ($RADIXGATE_REDIS_URL, default 127.0.0.1:6379) under a key prefix of its own, deleted
afterwards. Three conversations go side by side, one turn each in turn: the native session route
(only the new message sent), OpenAI chat completions and Anthropic messages (the whole
conversation resent, placed on the tree by the gateway). Per streamed turn, client TTFT is
POST -> first text, and engine TTFT is the engine's arrival -> first token, read from the turn's
`chat` span (`gen_ai.response.time_to_first_chunk`); their difference is the gateway's overhead
(HTTP, auth, the store's round trips, rendering, the hop to the worker and back, SSE). Then each
store operation runs back to back against `SessionStore` for a few seconds. Prints the tables,
writes JSON and a PNG plot.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
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
from benchmarks.overhead_routes import Conversation, streamed_turn
from engine.client import EngineClient
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.local_server import serve_local
from gateway.settings import GatewaySettings
from gateway.worker import free_port
from observability.semconv import GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, INPUT_TURN_ID
from sessions import NewTurn, SessionStore

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
TENANT = "bench"
SYSTEM = "You are a terse assistant."


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


ROUTES = ("native", "openai", "anthropic")


@contextmanager
def engine_worker(threads: int) -> Iterator[str]:
    """A `radixgate engine` worker process on a free port; yields its address once it answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "gateway.cli", "engine", "--port",
                                str(port), "--threads", str(threads), "--kv-memory", "1024"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"tcp://127.0.0.1:{port}"

    async def wait() -> None:
        client = await EngineClient.connect(address)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    await client.stats(timeout_s=2.0)
                    return
                except TimeoutError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the engine worker did not start") from None
        finally:
            await client.close()

    try:
        asyncio.run(wait())
        yield address
    finally:
        process.terminate()
        process.wait(30)


class ChatSpansOnly(Sampler):
    """Records only the `chat {model}` spans (they carry the engine's TTFT): the other spans
    are dropped as with tracing off, so measuring costs the gateway one span per turn."""

    def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None,
                      trace_state: Any = None) -> SamplingResult:
        decision = Decision.RECORD_AND_SAMPLE if name.startswith("chat ") else Decision.DROP
        return SamplingResult(decision, attributes if decision is Decision.RECORD_AND_SAMPLE
                              else None)

    def get_description(self) -> str:
        return "ChatSpansOnly"


def run_routes(base_url: str, exporter: InMemorySpanExporter, num_turns: int,
               max_tokens: int) -> list[dict[str, Any]]:
    """`num_turns` streamed turns on each route, interleaved; one row per turn."""
    rows = []
    with httpx.Client(base_url=base_url, timeout=300) as http:
        native = http.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
        convs = {"native": Conversation("native", session_id=native),
                 "openai": Conversation("openai", messages=[
                     {"role": "system", "content": SYSTEM}]),
                 "anthropic": Conversation("anthropic")}
        for route in ROUTES:  # first-call costs (imports, grammar caches) stay out
            streamed_turn(http, Conversation(route, session_id=http.post(
                "/v1/sessions", json={}).json()["id"]), "warm-up", 2)
        for i in range(num_turns):
            text = f"Step {i}: list two files to read next and say why, briefly."
            for route in ROUTES:
                timed = streamed_turn(http, convs[route], text, max_tokens)
                engine_ttft = _engine_ttft(exporter, timed.input_turn_id)
                overhead = timed.client_ttft_s - engine_ttft
                rows.append({"turn": i, "route": route, "client_ttft_s": timed.client_ttft_s,
                             "engine_ttft_s": engine_ttft, "overhead_s": overhead,
                             "total_s": timed.total_s})
                log(f"turn {i:2d} {route:9s}: client TTFT {timed.client_ttft_s * 1e3:.1f} ms, "
                    f"engine {engine_ttft * 1e3:.1f} ms, overhead {overhead * 1e3:.1f} ms")
    return rows


def _engine_ttft(exporter: InMemorySpanExporter, input_turn_id: str) -> float:
    """The engine TTFT the turn's `chat` span recorded (it ends before the stream does)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for span in exporter.get_finished_spans():
            attrs = span.attributes or {}
            if attrs.get(INPUT_TURN_ID) == input_turn_id:
                return float(attrs[GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK])  # type: ignore[arg-type]
        time.sleep(0.01)
    raise RuntimeError(f"no chat span for input turn {input_turn_id}")


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


def overhead_by_route(turns: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for route in ROUTES:
        ms = [r["overhead_s"] * 1e3 for r in turns if r["route"] == route]
        out[route] = {"p50": percentile(ms, 50), "p99": percentile(ms, 99),
                      "mean": statistics.fmean(ms), "n": len(ms)}
    return out


def summarise(result: dict[str, Any]) -> None:
    ms = 1e3
    print("\nGateway TTFT overhead per streamed turn (ms)")
    print(format_table(
        ["turn", "route", "client ttft", "engine ttft", "overhead"],
        [[r["turn"], r["route"], r["client_ttft_s"] * ms, r["engine_ttft_s"] * ms,
          r["overhead_s"] * ms] for r in result["turns"]]))
    print("\nGateway TTFT - engine TTFT, side by side (ms)")
    print(format_table(["route", "p50", "p99", "mean", "turns"],
                       [[route, o["p50"], o["p99"], o["mean"], o["n"]]
                        for route, o in result["overhead_ms"].items()]))
    print("\nSession store, one client back to back")
    print(format_table(["operation", "ops", "seconds", "ops/s", "latency ms"],
                       [[r["op"], r["ops"], r["seconds"], r["ops_per_s"],
                         1e3 / r["ops_per_s"]] for r in result["store"]]))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for route in ROUTES:
        turns = [r for r in result["turns"] if r["route"] == route]
        ax1.plot([r["turn"] for r in turns], [r["overhead_s"] * 1e3 for r in turns],
                 marker="o", markersize=3, label=f"{route} (p50 "
                 f"{result['overhead_ms'][route]['p50']:.1f} ms)")
    ax1.set(xlabel="turn", ylabel="ms", title="Gateway overhead: client TTFT - engine TTFT")
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
    torch.set_num_threads(1)  # the gateway's own thread; the worker gets THREADS
    num_turns = args.turns or (6 if args.quick else 16)
    seconds = args.store_seconds or (1.0 if args.quick else 3.0)
    redis_url = os.environ.get("RADIXGATE_REDIS_URL", DEFAULT_REDIS_URL)
    prefix = f"bench:{uuid.uuid4().hex}:"
    tokenizer = Tokenizer.from_gguf(embedded_gguf_path())
    notes = machine_notes(embedded_gguf_path())
    settings = GatewaySettings(redis_url=redis_url, key_prefix=prefix)
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ChatSpansOnly())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        log("starting the engine worker")
        with engine_worker(THREADS) as address, serve_local(
                None, settings, model_name="smollm2-135m", kv_memory_bytes=0,
                tracer_provider=provider, engine_url=address, tokenizer=tokenizer) as base_url:
            turns = run_routes(base_url, exporter, num_turns, args.max_tokens)
        store = asyncio.run(store_rates(redis_url, prefix, seconds))
    finally:
        log(f"deleted {delete_prefix(redis_url, prefix)} benchmark keys")
    finish_notes(notes)
    result = {"notes": notes, "redis_url": redis_url, "max_tokens": args.max_tokens,
              "turns": turns, "store": store, "overhead_ms": overhead_by_route(turns)}
    summarise(result)
    write_json(args.json, result)
    plot(result, plot_path(args.json))


if __name__ == "__main__":
    main()
