"""Extend attention over the paged pool (a turn's delta after a cached prefix): the C extend
kernel (row_math.h's arithmetic: a row's bits as in a decode) against torch's flash kernel on
the gathered K/V, and against AMX tiles where the build has them, side by side in one process,
on three head shapes: Qwen2.5-Coder-1.5B's (12 query heads, 2 KV heads, 128 dims), SmolLM2's
(9, 3, 64) and Qwen2.5-0.5B's (14, 2, 64).

    python -m benchmarks.extend_attention_speed --json bench-results/extend_attention_speed.json

One layer, one sequence of 256 new rows at the end of 2k and 8k of context, fp32 and bf16 KV,
pages shuffled through the pool, every path through the "cpu" backend (the K/V store
included). The paths alternate call by call; reports median milliseconds, torch time / C time,
and each one's rate in attention GFLOP/s (4 * rows * context * head_dim * heads, causal part
counted in full). The table in engine/attention/cpu_extend.py comes from this.
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

SHAPES = ((12, 2, 128), (9, 3, 64), (14, 2, 64))  # (query heads, KV heads, head_dim)
PAGE_SIZE, ROWS = 16, 256
CONTEXTS = (2048, 8192)


def one_sequence(pool: KVPool, extend_len: int, context_len: int) -> PagedBatch:
    pages = list(range(pool.layout.num_pages))
    random.Random(0).shuffle(pages)
    table = torch.tensor(pages[: -(-context_len // PAGE_SIZE)], dtype=torch.int64)
    positions = torch.arange(context_len - extend_len, context_len)
    slots = table[positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE
    return PagedBatch([extend_len], [context_len], slots, [table])


def backend(pool: KVPool, batch: PagedBatch, path: str) -> CpuPagedAttention:
    """The "cpu" backend with long extends on `path` (cpu_extend.PATHS)."""
    os.environ[CHOICE_ENV] = path
    extend_choice.cache_clear()
    made = CpuPagedAttention(pool, batch)
    assert (made.extend_index is not None) == (path != "torch") and made.extend_amx == (
        path == "amx")
    return made


def measure(repeats: int, amx: bool) -> list[dict[str, Any]]:
    rows = []
    for heads, kv_heads, head_dim in SHAPES:
        cfg = ModelConfig(architecture="llama", num_layers=1, hidden_size=heads * head_dim,
                          intermediate_size=8, num_heads=heads, num_kv_heads=kv_heads,
                          head_dim=head_dim, vocab_size=32, rope_theta=10000.0,
                          rms_norm_eps=1e-5, max_position_embeddings=max(CONTEXTS),
                          tie_word_embeddings=True)
        spec = AttentionSpec.plain(0, head_dim)
        for dtype in (torch.float32, torch.bfloat16):
            pool = KVPool(cfg, KVLayout(num_pages=max(CONTEXTS) // PAGE_SIZE + 16,
                                        page_size=PAGE_SIZE, bytes_per_page=0), dtype)
            pool.k[0].normal_()
            pool.v[0].normal_()
            names = ["c", "torch", *(["amx"] if amx and dtype == torch.bfloat16 else [])]
            for context_len in CONTEXTS:
                batch = one_sequence(pool, ROWS, context_len)
                # In the model's dtype: fp32 q from an fp32 model, bf16 under mixed precision.
                q = torch.randn(ROWS, heads, head_dim).to(dtype)
                k = torch.randn(ROWS, kv_heads, head_dim).to(dtype)
                paths = {name: backend(pool, batch, name) for name in names}
                times: dict[str, list[float]] = {name: [] for name in paths}
                for i in range(repeats + 2):
                    for name, path in paths.items():
                        started = time.perf_counter()
                        path(spec, q, k, k)
                        if i >= 2:  # two warm-up rounds
                            times[name].append(time.perf_counter() - started)
                ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
                flops = 4 * ROWS * context_len * head_dim * heads
                row = {"heads": f"{heads}/{kv_heads}x{head_dim}",
                       "dtype": str(dtype).removeprefix("torch."), "rows": ROWS,
                       "context_len": context_len, "c_ms": ms["c"], "torch_ms": ms["torch"],
                       "amx_ms": ms.get("amx"), "torch_over_c": ms["torch"] / ms["c"],
                       "c_gflops": flops / ms["c"] / 1e6, "torch_gflops": flops / ms["torch"] / 1e6}
                log(f"{row['heads']} {row['dtype']} context {context_len}: C {ms['c']:.2f} ms, "
                    f"torch flash {ms['torch']:.2f} ms"
                    + (f", AMX {ms['amx']:.2f} ms" if "amx" in ms else ""))
                rows.append(row)
    os.environ.pop(CHOICE_ENV, None)
    extend_choice.cache_clear()
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for heads in dict.fromkeys(r["heads"] for r in rows):
        for dtype in ("float32", "bfloat16"):
            sel = [r for r in rows if r["dtype"] == dtype and r["heads"] == heads]
            ax.plot([r["context_len"] for r in sel], [r["torch_over_c"] for r in sel],
                    marker="o", label=f"{heads}, {dtype} KV")
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
    rows = measure(args.repeats, ext.simd() == "amx")
    finish_notes(notes)
    print(format_table(["heads", "KV", "rows", "context", "C ms", "torch ms", "AMX ms",
                        "torch/C", "C GFLOP/s", "torch GFLOP/s"],
                       [[r["heads"], r["dtype"], r["rows"], r["context_len"], r["c_ms"],
                         r["torch_ms"], r["amx_ms"],
                         r["torch_over_c"], r["c_gflops"], r["torch_gflops"]] for r in rows]))
    print(load_line(notes))
    write_json(args.json, {"notes": notes, "rows": rows})
    plot(rows, plot_path(args.json))
    log(f"wrote {args.json} and {plot_path(args.json)}")


if __name__ == "__main__":
    main()
