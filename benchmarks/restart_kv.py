"""KV that survives a worker restart: TTFT of the first turn after a restart, against the same
turn on a warm worker and on a cold one that recomputes.

    python -m benchmarks.restart_kv --json bench-results/restart_kv.json [--quick]

The real model in-process (fp32, 2 threads). Per context length: a worker with a disk tier
(`--kv-disk`) runs a session's history (one turn bound to a turn id) and pins its head, which
writes the head's pages to files. Then the next turn (a 256-token delta) runs on that warm
worker, on a fresh worker over the same directory (a restart: its radix cache is empty and it
loads the pages from disk on first use), and on a fresh worker without the tier (recompute).
Medians of `--repeats`. The files were just written, so the restart reads them from the OS
page cache, as a worker restarted after a crash on the same host usually does; a host reboot
reads them from disk.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
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
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel, load_model
from engine.models.locate import embedded_gguf_path
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

DELTA = 256


def tokens(n: int, seed: int) -> list[int]:
    return [1000 + (seed * 7919 + 31 * i) % 40000 for i in range(n)]


def run(engine: Engine, request_id: str, token_ids: list[int],
        bind: str | None = None) -> Finished:
    engine.submit(Extend(request_id, "bench", None, token_ids,
                         SamplingParams(max_tokens=1, ignore_eos=True), bind_turn_id=bind))
    return next(m for m in engine.run_until_idle()
                if isinstance(m, Finished) and m.request_id == request_id)


def measure(loaded: LoadedModel, context_len: int, repeats: int, kv_dir: Path) -> dict[str, Any]:
    def config(disk: bool) -> EngineConfig:
        return EngineConfig(kv_memory_bytes=1 << 30, spec="none",
                            kv_dir=str(kv_dir) if disk else None,
                            kv_disk_bytes=4 << 30 if disk else 0)

    history = tokens(context_len, context_len)
    warm_engine = Engine(loaded, config(True))
    run(warm_engine, "history", history, bind="head")
    started = time.perf_counter()
    warm_engine.pin("head", 600)
    write_s = time.perf_counter() - started
    samples: dict[str, list[float]] = {"warm": [], "restart": [], "cold": []}
    cached: dict[str, int] = {}
    for i in range(repeats):
        turn = history + tokens(DELTA, context_len + 1 + i)  # a new delta each time
        done = run(warm_engine, f"warm{i}", turn)
        samples["warm"].append(done.timings.ttft_s)
        cached["warm"] = done.cached_len
        restarted = Engine(loaded, config(True))
        done = run(restarted, f"restart{i}", turn)
        samples["restart"].append(done.timings.ttft_s)
        cached["restart"] = done.cached_len
        if i == 0:  # recompute is slow and steady: one sample
            done = run(Engine(loaded, config(False)), "cold", turn)
            samples["cold"].append(done.timings.ttft_s)
            cached["cold"] = done.cached_len
        log(f"  {context_len}: repeat {i + 1}/{repeats}")
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return {"context_len": context_len, "delta": DELTA, "samples": samples, "cached": cached,
            "ttft_s": medians, "write_s": write_s,
            "restart_vs_warm": medians["restart"] / medians["warm"],
            "cold_vs_restart": medians["cold"] / medians["restart"]}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.25
    for i, mode in enumerate(("warm", "restart", "cold")):
        ax.bar([j + (i - 1) * width for j in range(len(rows))],
               [r["ttft_s"][mode] for r in rows], width, label=mode)
    ax.set_xticks(range(len(rows)), [f"{r['context_len']} + {DELTA}" for r in rows])
    ax.set_ylabel("TTFT (s)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("first turn after a worker restart (KV loaded from disk)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=Path("bench-results/restart_kv.json"))
    parser.add_argument("--contexts", default="4000,7500")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="1k context, 2 repeats")
    args = parser.parse_args()
    contexts = [1000] if args.quick else [int(c) for c in args.contexts.split(",")]
    repeats = args.repeats or (2 if args.quick else 5)
    torch.set_num_threads(THREADS)
    notes = machine_notes(embedded_gguf_path())
    log("loading the model")
    loaded = load_model(None)
    rows = []
    for context_len in contexts:
        with tempfile.TemporaryDirectory() as kv_dir:
            rows.append(measure(loaded, context_len, repeats, Path(kv_dir)))
    finish_notes(notes)
    result = {"machine": notes, "repeats": repeats, "rows": rows}
    table = format_table(
        ["context + delta", "warm TTFT s", "restart TTFT s", "cold TTFT s", "restart/warm",
         "cold/restart", "cached after restart", "write at pin s"],
        [[f"{r['context_len']} + {DELTA}", r["ttft_s"]["warm"], r["ttft_s"]["restart"],
          r["ttft_s"]["cold"], r["restart_vs_warm"], r["cold_vs_restart"],
          r["cached"]["restart"], r["write_s"]] for r in rows])
    publish(args.json, result, table, plot)


if __name__ == "__main__":
    main()
