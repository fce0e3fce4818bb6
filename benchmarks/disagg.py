"""Inter-token latency of streaming decodes while long prefills arrive: one engine worker that
does both (monolithic) vs a prefill worker and a decode worker (disaggregated), same cores.

    python -m benchmarks.disagg --json bench-results/disagg.json [--quick]

Both modes run real `radixgate engine` processes with the real model, driven over ZeroMQ by
`EngineClient`: monolithic is one worker with 2 threads; disaggregated is a prefill worker and a
decode worker (`--prefill-peer`) with 1 thread each, so both use this machine's 2 cores. In each,
`--decodes` requests (a short prompt, `--decode-tokens` tokens each, drafting off) stream while
`--prefills` requests with `--prefill-len` new tokens arrive one after another. Reported: the
decodes' inter-token latency p50/p99 (gaps between streamed chunks once all of them stream, and
those that end while a prefill is in flight), the long prefills' TTFT, and the KV pages that
crossed.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import finish_notes, format_table, log, machine_notes, publish
from benchmarks.gateway_overhead import percentile
from engine.client import EngineClient
from engine.models.locate import embedded_gguf_path
from engine.protocol import Extend, Failed, Finished, Stats, TokenChunk
from engine.sampling_params import SamplingParams
from gateway.worker import free_port

COMMON = ["--kv-memory", "768", "--spec", "none", "--max-batch-tokens", "512"]


@contextmanager
def worker(threads: int, *args: str) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "engine", "--port", str(port), "--threads",
         str(threads), *COMMON, *args], stderr=subprocess.DEVNULL)
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


async def stats(address: str, timeout_s: float = 300.0) -> Stats:
    deadline = time.monotonic() + timeout_s
    while True:
        client = await EngineClient.connect(address)
        try:
            return await client.stats(timeout_s=2.0)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
        finally:
            await client.close()


def tokens(n: int, seed: int) -> list[int]:
    return [200 + (i * 7919 + seed * 104729) % 40000 for i in range(n)]


async def one(client: EngineClient, request: Extend, chunk_times: list[float]) -> Finished:
    async for message in client.extend(request):
        if isinstance(message, TokenChunk):
            chunk_times.append(time.perf_counter())
        elif isinstance(message, Failed):
            raise RuntimeError(f"{request.request_id}: {message.message}")
        elif isinstance(message, Finished):
            return message
    raise RuntimeError(f"{request.request_id}: no Finished")


async def workload(address: str, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    client = await EngineClient.connect(address)
    warm = SamplingParams(max_tokens=2, ignore_eos=True)
    await one(client, Extend(f"{tag}-warm", "bench", None, tokens(args.prefill_len // 4, 99),
                             warm), [])
    decode_params = SamplingParams(max_tokens=args.decode_tokens, ignore_eos=True)
    decode_times: list[list[float]] = [[] for _ in range(args.decodes)]
    decodes = [asyncio.create_task(one(client, Extend(f"{tag}-d{i}", "bench", None,
                                                      tokens(200, i), decode_params),
                                       decode_times[i])) for i in range(args.decodes)]
    while sum(bool(t) for t in decode_times) < args.decodes:
        await asyncio.sleep(0.01)  # every decode streams before the first prefill arrives
    all_streaming = time.perf_counter()
    windows: list[tuple[float, float]] = []
    ttfts: list[float] = []
    for p in range(args.prefills):
        started = time.perf_counter()
        first: list[float] = []
        await one(client, Extend(f"{tag}-p{p}", "bench", None,
                                 tokens(args.prefill_len, 1000 + p),
                                 SamplingParams(max_tokens=1, ignore_eos=True)), first)
        windows.append((started, first[0] if first else time.perf_counter()))
        ttfts.append(windows[-1][1] - started)
        await asyncio.sleep(args.gap_s)
    unfinished = sum(not t.done() for t in decodes)
    await asyncio.gather(*decodes)
    await client.close()
    # Gaps from when all decodes stream: their own prompts' prefills are not what is measured.
    gaps = [(b - a, b) for times in decode_times for a, b in zip(times, times[1:], strict=False)
            if a >= all_streaming]
    during = [g for g, at in gaps if any(s <= at <= e for s, e in windows)]
    return {"itl_p50_ms": 1000 * percentile([g for g, _ in gaps], 50),
            "itl_p99_ms": 1000 * percentile([g for g, _ in gaps], 99),
            "itl_during_prefill_p50_ms": 1000 * percentile(during, 50) if during else None,
            "itl_during_prefill_p99_ms": 1000 * percentile(during, 99) if during else None,
            "num_gaps": len(gaps), "num_gaps_during_prefill": len(during),
            "prefill_ttft_s": ttfts, "decodes_running_after_prefills": unfinished}


async def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with ExitStack() as stack:
        if mode == "monolithic":
            address = stack.enter_context(worker(2))
            await stats(address)
            result = await workload(address, args, mode)
            result["kv_pages_moved"] = 0
            return result
        prefill = stack.enter_context(worker(1))
        decode = stack.enter_context(worker(1, "--prefill-peer", prefill,
                                            "--disagg-min-tokens", "256"))
        await stats(prefill)
        deadline = time.monotonic() + 120
        while (await stats(decode)).num_kv_peers < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the KV pair did not form")
            await asyncio.sleep(0.2)
        result = await workload(decode, args, mode)
        s = await stats(decode)
        result["kv_pages_moved"] = s.num_kv_received_pages
        result["kv_fallbacks"] = s.num_kv_fallbacks
        return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(result["modes"])
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.2
    for i, key in enumerate(("itl_p50_ms", "itl_p99_ms", "itl_during_prefill_p50_ms",
                             "itl_during_prefill_p99_ms")):
        ax.bar([m + (i - 1.5) * width for m in range(len(modes))],
               [result["modes"][m][key] or 0 for m in modes], width, label=key)
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylabel("inter-token latency (ms)")
    ax.set_title(f"{result['config']['decodes']} streaming decodes, "
                 f"{result['config']['prefill_len']}-token prefills arriving")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=Path("bench-results/disagg.json"))
    parser.add_argument("--decodes", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=192)
    parser.add_argument("--prefills", type=int, default=3)
    parser.add_argument("--prefill-len", type=int, default=4096)
    parser.add_argument("--gap-s", type=float, default=0.5)
    parser.add_argument("--quick", action="store_true", help="1k-token prefills, fewer tokens")
    args = parser.parse_args()
    if args.quick:
        args.prefill_len, args.decode_tokens, args.prefills = 1024, 64, 2
    notes = machine_notes(embedded_gguf_path())
    modes: dict[str, Any] = {}
    for mode in ("monolithic", "disaggregated"):
        log(f"{mode}: {args.decodes} decodes x {args.decode_tokens} tokens, "
            f"{args.prefills} prefills of {args.prefill_len} tokens")
        modes[mode] = asyncio.run(run_mode(mode, args))
    finish_notes(notes)
    rows = [[m, r["itl_p50_ms"], r["itl_p99_ms"], r["itl_during_prefill_p50_ms"],
             r["itl_during_prefill_p99_ms"], max(r["prefill_ttft_s"]), r["kv_pages_moved"]]
            for m, r in modes.items()]
    mono, dis = modes["monolithic"], modes["disaggregated"]
    table = format_table(["mode", "ITL p50 ms", "ITL p99 ms", "ITL p50 in prefill",
                          "ITL p99 in prefill", "prefill TTFT max s", "KV pages moved"], rows)
    table += (f"\nITL p99 disaggregated / monolithic: "
              f"{dis['itl_p99_ms'] / mono['itl_p99_ms']:.2f}x; monolithic runs one worker with "
              "2 threads, disaggregated a prefill and a decode worker with 1 thread each")
    result = {"machine": notes, "config": vars(args) | {"json": str(args.json)}, "modes": modes}
    publish(args.json, result, table, plot)


if __name__ == "__main__":
    main()
