"""The host KV tier against recompute: a replay whose working set is 4x the device KV pool.

    python -m benchmarks.host_tier --json bench-results/host_tier.json [--quick]

The real model in-process (fp32, 2 threads). `--sessions` agent sessions take turns round
robin, as agents do while their tools run: each turn sends the session's whole token path
plus a tool result of ~100 tokens and generates 8. The device pool is sized to a quarter of
the final working set, so a session's KV is evicted before its next turn comes. Two engines
run the same replay side by side: the radix cache alone (evicted history is recomputed) and
the radix cache with a host tier as large as the working set (evicted pages are copied back).
Per mode: prefix-cache hit rate, engine TTFT p50/p99/mean per turn, pages restored, wall time,
and whether greedy outputs are identical. Prints the table, writes JSON, text and a PNG plot.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    THREADS,
    finish_notes,
    format_table,
    log,
    machine_notes,
    publish,
)
from benchmarks.gateway_overhead import percentile
from engine.engine import Engine, EngineConfig
from engine.kv_pool import plan_kv_layout
from engine.models.loader import LoadedModel, load_model
from engine.models.locate import embedded_gguf_path
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

PAGE_SIZE = 16
OUTPUT_LEN = 8


def session_texts(index: int, num_turns: int) -> tuple[str, list[str]]:
    system = (f"You are agent {index} in a repository of parsers. Work step by step, read files "
              "with the read tool, and run the tests after every edit. ") * 4
    results = [f"Tool result {turn} for agent {index}:\n" + "".join(
        f"line {turn}.{i}: value_{index}_{i} = parse(field_{i})\n" for i in range(8))
        for turn in range(num_turns)]
    return system, results


def run_mode(loaded: LoadedModel, sessions: list[tuple[list[int], list[list[int]]]],
             kv_bytes: int, host_bytes: int) -> dict[str, Any]:
    engine = Engine(loaded, EngineConfig(page_size=PAGE_SIZE, kv_memory_bytes=kv_bytes,
                                         host_kv_memory_bytes=host_bytes, spec="none"))
    params = SamplingParams(max_tokens=OUTPUT_LEN, ignore_eos=True)
    paths = [list(system) for system, _ in sessions]
    num_turns = len(sessions[0][1])
    turns: list[dict[str, Any]] = []
    outputs: list[list[int]] = []
    started = time.perf_counter()
    for turn in range(num_turns):
        for s, (_, results) in enumerate(sessions):
            paths[s].extend(results[turn])
            request_id = f"s{s}t{turn}"
            engine.submit(Extend(request_id, "bench", None, list(paths[s]), params))
            done = next(m for m in engine.run_until_idle()
                        if isinstance(m, Finished) and m.request_id == request_id)
            paths[s].extend(done.output_token_ids)
            outputs.append(done.output_token_ids)
            turns.append({"session": s, "turn": turn, "prompt_len": done.prompt_len,
                          "cached_len": done.cached_len, "ttft_s": done.timings.ttft_s})
        log(f"  host tier {host_bytes >> 20} MiB: turn {turn + 1}/{num_turns} done")
    wall = time.perf_counter() - started
    engine.check_invariants()
    later = [t for t in turns if t["turn"] > 0]  # a session's first turn has nothing cached
    ttfts = [t["ttft_s"] for t in later]
    return {"host_kv_mib": host_bytes >> 20, "wall_s": wall, "turns": turns,
            "outputs": outputs, "num_device_pages": engine.page_pool.num_pages,
            "hit_rate": sum(t["cached_len"] for t in later) / sum(t["prompt_len"] for t in later),
            "ttft_p50_s": statistics.median(ttfts), "ttft_p99_s": percentile(ttfts, 99),
            "ttft_mean_s": statistics.fmean(ttfts),
            "pages_restored": engine.tiers.host.num_restored if engine.tiers.host else 0}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for mode in result["modes"]:
        later = [t for t in mode["turns"] if t["turn"] > 0]
        label = f"host tier {mode['host_kv_mib']} MiB" if mode["host_kv_mib"] else "no tier"
        ax.plot(range(len(later)), [t["ttft_s"] * 1e3 for t in later], label=label)
    ax.set_xlabel("turn (after each session's first), in replay order")
    ax.set_ylabel("engine TTFT (ms)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(f"{result['sessions']} sessions, working set "
                 f"{result['working_set_pages']} pages, device pool {result['device_pages']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=Path("bench-results/host_tier.json"))
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="8 sessions x 3 turns")
    args = parser.parse_args()
    num_sessions = args.sessions or (8 if args.quick else 32)
    num_turns = args.turns or (3 if args.quick else 4)
    torch.set_num_threads(THREADS)
    notes = machine_notes(embedded_gguf_path())
    log("loading the model")
    loaded = load_model(None)
    tok = loaded.tokenizer
    sessions = []
    for i in range(num_sessions):
        system, results = session_texts(i, num_turns)
        sessions.append((tok.encode(system), [tok.encode(r) for r in results]))
    final_len = max(len(sys) + sum(map(len, res)) + num_turns * OUTPUT_LEN
                    for sys, res in sessions)
    working_set = num_sessions * -(-final_len // PAGE_SIZE)
    layout = plan_kv_layout(loaded.model.config, 64 << 20, PAGE_SIZE, loaded.model.dtype)
    page_bytes = layout.bytes_per_page
    kv_bytes = max(working_set // 4, 4 * -(-final_len // PAGE_SIZE)) * page_bytes
    host_bytes = working_set * page_bytes
    log(f"{num_sessions} sessions x {num_turns} turns: working set {working_set} pages, "
        f"device pool {kv_bytes // page_bytes} pages ({kv_bytes >> 20} MiB), page {page_bytes} B")
    modes = [run_mode(loaded, sessions, kv_bytes, 0),
             run_mode(loaded, sessions, kv_bytes, host_bytes)]
    finish_notes(notes)
    plain, tiered = modes
    identical = plain["outputs"] == tiered["outputs"]
    result = {"machine": notes, "sessions": num_sessions, "turns": num_turns,
              "working_set_pages": working_set, "device_pages": kv_bytes // page_bytes,
              "page_bytes": page_bytes, "identical_greedy_outputs": identical,
              "modes": modes}
    table = format_table(
        ["mode", "hit rate", "TTFT p50 ms", "TTFT p99 ms", "TTFT mean ms", "pages restored",
         "wall s"],
        [[f"host tier {m['host_kv_mib']} MiB" if m["host_kv_mib"] else "no tier (recompute)",
          f"{m['hit_rate']:.1%}", m["ttft_p50_s"] * 1e3, m["ttft_p99_s"] * 1e3,
          m["ttft_mean_s"] * 1e3, m["pages_restored"], m["wall_s"]] for m in modes])
    table += (f"\nTTFT p50 no tier / tier: {plain['ttft_p50_s'] / tiered['ttft_p50_s']:.2f}x; "
              f"greedy outputs identical: {identical}")
    publish(args.json, result, table, plot)


if __name__ == "__main__":
    main()
