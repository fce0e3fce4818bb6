"""Extend attention over the paged pool (a turn's delta after a cached prefix): the C extend
kernel against torch's flash kernel on the gathered K/V (the path it replaces), side by side in
one process, on SmolLM2-135M's head shape (9 query heads, 3 KV heads, 64 dims).

    python -m benchmarks.extend_attention_speed --json bench-results/extend_attention_speed.json

One layer, one sequence of 256 new rows at the end of 1k/2k/4k/7.5k of context, fp32 and bf16
KV, pages shuffled through the pool, both through the "cpu" backend (the K/V store included).
The two alternate call by call; reports median milliseconds, the ratio, and each one's rate in
attention GFLOP/s (4 * rows * context * head_dim * heads, causal part counted in full).
The table in engine/attention/cpu_extend.py comes from this.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
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
    write_json,
)
from engine.attention.base import PagedBatch
from engine.attention.cpu_extend import CHOICE_ENV, extend_choice, kernel
from engine.attention.cpu_paged import CpuPagedAttention
from engine.attention.spec import AttentionSpec
from engine.config import ModelConfig
from engine.kv_pool import KVLayout, KVPool

HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE, ROWS = 9, 3, 64, 16, 256
CONTEXTS = (1024, 2048, 4096, 7680)


def one_sequence(pool: KVPool, extend_len: int, context_len: int) -> PagedBatch:
    pages = list(range(pool.layout.num_pages))
    random.Random(0).shuffle(pages)
    table = torch.tensor(pages[: -(-context_len // PAGE_SIZE)], dtype=torch.int64)
    positions = torch.arange(context_len - extend_len, context_len)
    slots = table[positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE
    return PagedBatch([extend_len], [context_len], slots, [table])


def backend(pool: KVPool, batch: PagedBatch, use_c: bool) -> CpuPagedAttention:
    """The "cpu" backend with long extends on the C kernel or on torch's flash kernel."""
    os.environ[CHOICE_ENV] = "c" if use_c else "torch"
    extend_choice.cache_clear()
    made = CpuPagedAttention(pool, batch)
    assert (made.extend_index is not None) == use_c
    return made


def measure(repeats: int) -> list[dict[str, Any]]:
    cfg = ModelConfig(architecture="llama", num_layers=1, hidden_size=HEADS * HEAD_DIM,
                      intermediate_size=8, num_heads=HEADS, num_kv_heads=KV_HEADS,
                      head_dim=HEAD_DIM, vocab_size=32, rope_theta=10000.0, rms_norm_eps=1e-5,
                      max_position_embeddings=8192, tie_word_embeddings=True)
    spec = AttentionSpec.plain(0, HEAD_DIM)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        pool = KVPool(cfg, KVLayout(num_pages=8192 // PAGE_SIZE, page_size=PAGE_SIZE,
                                    bytes_per_page=0), dtype)
        pool.k[0].normal_()
        pool.v[0].normal_()
        for context_len in CONTEXTS:
            batch = one_sequence(pool, ROWS, context_len)
            # In the model's dtype: fp32 q from an fp32 model, bf16 under mixed precision.
            q = torch.randn(ROWS, HEADS, HEAD_DIM).to(dtype)
            k = torch.randn(ROWS, KV_HEADS, HEAD_DIM).to(dtype)
            paths = {"c": backend(pool, batch, True), "torch": backend(pool, batch, False)}
            times: dict[str, list[float]] = {name: [] for name in paths}
            for i in range(repeats + 2):
                for name, path in paths.items():
                    started = time.perf_counter()
                    path(spec, q, k, k)
                    if i >= 2:  # two warm-up rounds
                        times[name].append(time.perf_counter() - started)
            c_s, torch_s = (statistics.median(times[n]) for n in ("c", "torch"))
            flops = 4 * ROWS * context_len * HEAD_DIM * HEADS
            row = {"dtype": str(dtype).removeprefix("torch."), "rows": ROWS,
                   "context_len": context_len, "c_ms": c_s * 1e3, "torch_ms": torch_s * 1e3,
                   "torch_over_c": torch_s / c_s, "c_gflops": flops / c_s / 1e9,
                   "torch_gflops": flops / torch_s / 1e9}
            log(f"{row['dtype']} context {context_len}: C {row['c_ms']:.2f} ms, torch flash "
                f"{row['torch_ms']:.2f} ms")
            rows.append(row)
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for dtype in ("float32", "bfloat16"):
        sel = [r for r in rows if r["dtype"] == dtype]
        ax.plot([r["context_len"] for r in sel], [r["torch_over_c"] for r in sel], marker="o",
                label=f"{dtype} KV")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="context tokens", ylabel="torch flash time / C kernel time",
           title=f"Extend attention, {ROWS} new rows, one layer, {THREADS} threads")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path,
                        default=Path("bench-results/extend_attention_speed.json"))
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    ext = kernel()
    if ext is None:
        raise SystemExit("the extend kernel is not built: run `make install` (needs a C "
                         "compiler)")
    torch.set_num_threads(THREADS)
    notes = machine_notes()
    notes["extend_kernel_simd"] = ext.simd()
    rows = measure(args.repeats)
    finish_notes(notes)
    print(format_table(["KV", "rows", "context", "C ms", "torch ms", "torch/C", "C GFLOP/s",
                        "torch GFLOP/s"],
                       [[r["dtype"], r["rows"], r["context_len"], r["c_ms"], r["torch_ms"],
                         r["torch_over_c"], r["c_gflops"], r["torch_gflops"]] for r in rows]))
    print(load_line(notes))
    write_json(args.json, {"notes": notes, "rows": rows})
    plot(rows, plot_path(args.json))
    log(f"wrote {args.json} and {plot_path(args.json)}")


if __name__ == "__main__":
    main()
