"""KV memory a long session holds with sliding-window memory against full-length KV.

    python -m benchmarks.swa_memory [--model gemma3-270m] [--context 32768] [--json PATH]

One session of `--context` tokens (a prompt of real text, then 16 output tokens) runs through an
engine whose sliding-window layers keep only the window (the default) and through one that keeps
their full-length KV (`--no-swa-memory`). Reported for each: the KV bytes the finished session
leaves cached (what a branch head costs to keep), the most bytes the running request held at any
step, TTFT, decode rate, and that both produced the same tokens. Prints a table, writes JSON and a
PNG bar chart.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    THREADS,
    finish_notes,
    format_table,
    load_line,
    log,
    machine_notes,
    plot_path,
    precision_label,
    write_json,
)
from benchmarks.workload import STDLIB_FILES, stdlib_source
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel, default_dtype, load_model
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

OUTPUT_TOKENS = 16
MIB = 1 << 20


def corpus(loaded: LoadedModel, num_tokens: int) -> list[int]:
    """`num_tokens` ids of standard-library source, BOS first where the model wants one."""
    text = "".join(stdlib_source(name) for name in STDLIB_FILES * 8)
    tok = loaded.tokenizer
    ids = tok.encode(text)
    if tok.add_bos_token and tok.bos_token_id is not None:
        ids = [tok.bos_token_id, *ids]
    if len(ids) < num_tokens:
        raise SystemExit(f"the corpus has {len(ids)} tokens, fewer than {num_tokens}")
    return ids[:num_tokens]


def held_bytes(engine: Engine, full_pages: int, swa_pages: int) -> int:
    layout = engine.kv_pool.layout
    return full_pages * layout.bytes_per_page + swa_pages * layout.swa_bytes_per_page


def run(loaded: LoadedModel, prompt: list[int], swa: bool, kv_memory: int) -> dict[str, Any]:
    engine = Engine(loaded, EngineConfig(kv_memory_bytes=kv_memory, max_batch_tokens=2048,
                                         swa_memory=swa, spec="none"))
    engine.submit(Extend("session", "bench", None, prompt,
                         SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True)))
    peak = 0
    started = time.perf_counter()
    done: Finished | None = None
    while engine.has_work:
        for message in engine.step():
            if isinstance(message, Finished):
                done = message
        req = engine.scheduler.find("session")
        if req is not None:
            live = sum(p >= 0 for p in req.swa_page_ids)
            peak = max(peak, held_bytes(engine, len(req.page_ids), live))
    assert done is not None
    cached = held_bytes(engine, engine.cache.num_cached_pages,
                        getattr(engine.cache, "num_cached_swa_pages", 0))
    log(f"{'sliding-aware' if swa else 'full-length'}: {cached / MIB:.0f} MiB cached, peak "
        f"{peak / MIB:.0f} MiB, TTFT {done.timings.ttft_s:.1f} s "
        f"({time.perf_counter() - started:.1f} s in all)")
    return {"mode": "sliding-aware" if swa else "full-length", "cached_bytes": cached,
            "peak_bytes": peak, "ttft_s": done.timings.ttft_s,
            "decode_tok_s": (done.output_len - 1) / max(done.timings.decode_s, 1e-9),
            "output_token_ids": done.output_token_ids,
            "pool": {"num_pages": engine.kv_pool.layout.num_pages,
                     "num_swa_pages": engine.kv_pool.layout.num_swa_pages}}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [r["mode"] for r in rows]
    ax.bar([n + "\ncached" for n in names], [r["cached_bytes"] / MIB for r in rows])
    ax.bar([n + "\npeak" for n in names], [r["peak_bytes"] / MIB for r in rows])
    ax.set_ylabel("KV MiB")
    ax.set_title(f"{result['model']}: one {result['context']}-token session")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--kv-memory", type=int, default=1536, metavar="MIB")
    parser.add_argument("--json", type=Path, default=Path("bench-results/swa_memory.json"))
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    loaded = load_model(args.model, default_dtype("cpu"))
    prompt = corpus(loaded, args.context - OUTPUT_TOKENS)
    notes = machine_notes(loaded.path)
    notes["precision"] = precision_label(loaded)
    rows = [run(loaded, prompt, swa, args.kv_memory * MIB) for swa in (True, False)]
    finish_notes(notes)
    same = rows[0]["output_token_ids"] == rows[1]["output_token_ids"]
    result = {"notes": notes, "model": loaded.name, "context": args.context, "rows": rows,
              "same_tokens": same}
    print(f"\nKV held by one {args.context}-token session ({loaded.name}, "
          f"{notes['precision']})")
    print(format_table(["mode", "cached MiB", "peak MiB", "TTFT s", "decode tok/s"],
                       [[r["mode"], r["cached_bytes"] / MIB, r["peak_bytes"] / MIB, r["ttft_s"],
                         r["decode_tok_s"]] for r in rows]))
    cached_ratio = rows[1]["cached_bytes"] / rows[0]["cached_bytes"]
    peak_ratio = rows[1]["peak_bytes"] / rows[0]["peak_bytes"]
    print(f"full-length / sliding-aware: cached {cached_ratio:.1f}x, peak {peak_ratio:.1f}x; "
          f"same tokens: {same}")
    print(load_line(notes))
    write_json(args.json, result)
    plot(result, plot_path(args.json))


if __name__ == "__main__":
    main()
