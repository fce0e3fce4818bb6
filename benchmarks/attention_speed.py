"""Decode and verify attention over the paged pool: the "cpu" kernel against the "torch" path,
side by side in one process, on three head shapes: Qwen2.5-Coder-1.5B's (12 query heads, 2 KV
heads, 128 dims), SmolLM2's (9, 3, 64) and Qwen2.5-0.5B's (14, 2, 64).

    python -m benchmarks.attention_speed --json bench-results/attention_speed.json

One layer, one sequence at 2k and 8k of context, 1 row (decode) and 9 rows (verification of 8
drafts), fp32 and bf16 KV, pages shuffled through the pool. Reports microseconds per call, the
ratio, and the kernel's effective KV read rate (K and V bytes of the context per call).
"""

from __future__ import annotations

import argparse
import random
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
from engine.attention.cpu_paged import CpuPagedAttention, kernel
from engine.attention.spec import AttentionSpec
from engine.attention.torch_paged import TorchPagedAttention
from engine.config import ModelConfig
from engine.kv_pool import KVLayout, KVPool

SHAPES = ((12, 2, 128), (9, 3, 64), (14, 2, 64))  # (query heads, KV heads, head_dim)
PAGE_SIZE = 16


class KernelForAllRows(CpuPagedAttention):
    """The kernel for verification rows too (the engine sends it decodes only: this is why)."""

    max_kernel_rows = 16
CONTEXTS = (2048, 8192)


def one_sequence(pool: KVPool, extend_len: int, context_len: int) -> PagedBatch:
    pages = list(range(pool.layout.num_pages))
    random.Random(0).shuffle(pages)
    table = torch.tensor(pages[: -(-context_len // PAGE_SIZE)], dtype=torch.int64)
    positions = torch.arange(context_len - extend_len, context_len)
    slots = table[positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE
    return PagedBatch([extend_len], [context_len], slots, [table])


def time_call(backend: Any, q: torch.Tensor, k: torch.Tensor, repeats: int) -> float:
    spec = AttentionSpec.plain(0, q.shape[-1])
    for _ in range(3):
        backend(spec, q, k, k)
    started = time.perf_counter()
    for _ in range(repeats):
        backend(spec, q, k, k)
    return (time.perf_counter() - started) / repeats


def measure(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for heads, kv_heads, head_dim in SHAPES:
        cfg = ModelConfig(architecture="llama", num_layers=1, hidden_size=heads * head_dim,
                          intermediate_size=8, num_heads=heads, num_kv_heads=kv_heads,
                          head_dim=head_dim, vocab_size=32, rope_theta=10000.0,
                          rms_norm_eps=1e-5, max_position_embeddings=max(CONTEXTS),
                          tie_word_embeddings=True)
        for dtype in (torch.float32, torch.bfloat16):
            pool = KVPool(cfg, KVLayout(num_pages=max(CONTEXTS) // PAGE_SIZE + 16,
                                        page_size=PAGE_SIZE, bytes_per_page=0), dtype)
            pool.k[0].normal_()
            pool.v[0].normal_()
            for extend_len in (1, 9):
                for context_len in CONTEXTS:
                    batch = one_sequence(pool, extend_len, context_len)
                    q = torch.randn(extend_len, heads, head_dim).to(dtype)
                    k = torch.randn(extend_len, kv_heads, head_dim).to(dtype)
                    plain = time_call(TorchPagedAttention(pool, batch), q, k, repeats)
                    fused = time_call(KernelForAllRows(pool, batch), q, k, repeats)
                    kv_bytes = 2 * context_len * kv_heads * head_dim * dtype.itemsize
                    row = {"heads": f"{heads}/{kv_heads}x{head_dim}",
                           "dtype": str(dtype).removeprefix("torch."), "rows": extend_len,
                           "context_len": context_len, "torch_us": plain * 1e6,
                           "cpu_us": fused * 1e6, "torch_over_cpu": plain / fused,
                           "cpu_kv_gb_s": kv_bytes / fused / 1e9}
                    log(f"{row['heads']} {row['dtype']} rows {extend_len} context "
                        f"{context_len}: torch {row['torch_us']:.0f} us, cpu "
                        f"{row['cpu_us']:.0f} us")
                    rows.append(row)
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for heads in dict.fromkeys(r["heads"] for r in rows):
        for dtype in ("float32", "bfloat16"):
            for num_rows in (1, 9):
                sel = [r for r in rows if r["heads"] == heads and r["dtype"] == dtype
                       and r["rows"] == num_rows]
                ax.plot([r["context_len"] for r in sel], [r["torch_over_cpu"] for r in sel],
                        marker="o", label=f"{heads} {dtype}, {num_rows} row(s)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="context tokens", ylabel="torch time / cpu kernel time",
           title=f"Paged decode/verify attention, one layer, {THREADS} threads")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=Path("bench-results/attention_speed.json"))
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    if kernel() is None:
        raise SystemExit("the CPU kernel is not built: run `make install` (needs a C compiler)")
    torch.set_num_threads(THREADS)
    notes = machine_notes()
    rows = measure(args.repeats)
    finish_notes(notes)
    print(format_table(["heads", "dtype", "rows", "context", "torch us", "cpu us", "torch/cpu",
                        "cpu KV GB/s"],
                       [[r["heads"], r["dtype"], r["rows"], r["context_len"], r["torch_us"],
                         r["cpu_us"], r["torch_over_cpu"], r["cpu_kv_gb_s"]] for r in rows]))
    print(load_line(notes))
    write_json(args.json, {"notes": notes, "rows": rows})
    plot(rows, plot_path(args.json))
    log(f"wrote {args.json} and {plot_path(args.json)}")


if __name__ == "__main__":
    main()
