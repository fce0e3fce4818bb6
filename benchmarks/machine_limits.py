"""What this machine can do on 2 threads: the ceilings decode and prefill are held against.

    python -m benchmarks.machine_limits [--model qwen2.5-coder-1.5b] [--quick]
        [--json bench-results/machine_limits.json]

- Memory read bandwidth: `torch.sum` over one fp32 buffer of `--buffer-gib` GiB (default 2; far
  larger than any L3), filled first so every page is resident. Each pass reads the whole buffer
  once from DRAM (the sum is a running reduction: no writes); GB/s = buffer bytes / seconds
  (1 GB = 1e9 bytes), the best of 7 passes (3 with --quick) after a discarded one. Decode reads
  every weight once per token, so its ceiling is bandwidth / (weight bytes + KV bytes) tokens/s.
- int8 GEMM peak: radixgate's own kernel, `engine.models.ggml_weight.ggml_linear` on the int8
  path (the fp32 rows quantised per block, then `_ggml_gemm`'s GEMM on the file's codes), on a
  `GgmlWeight` holding one real tensor of the model's GGUF: blk.0.attn_k (256 x 1536 Q4_K for
  Qwen2.5-Coder-1.5B: 221 KB, L2-resident), blk.0.attn_v (Q6_K there) and blk.0.attn_q (1536 x
  1536 Q4_K, 1.3 MB: a longer call, less easily disturbed), times 512 and 1024 fp32 rows.
  GOP/s = 2 * rows * n * k / seconds (a multiply-add is 2), the best of at least 7 calls and
  1 s of calls (3 and 0.3 s with --quick); the peak is the best (tensor, rows). Prefill's
  ceiling is this peak over its operations per token. On a loaded machine a 2-thread call often
  waits a scheduler tick for its second thread: the best call is the figure, and a fraction
  above 100% in model_speed means the peak was measured low.
- For reference, the fp32 and bf16 GEMM peaks of `torch.mm` (the GEMM torch's CPU build
  dispatches to: MKL or oneDNN) on in-cache shapes, GFLOP/s = 2 m n k / seconds, best likewise.

`measure_limits(gguf_path)` returns `Limits` for other benchmarks (model_speed prints decode as a
fraction of bandwidth and prefill as a fraction of the int8 peak); `decode_bytes_per_token` and
`prefill_ops` give the bytes and operations those fractions use.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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
from benchmarks.flops import extend_flops
from engine.config import ModelConfig

INT8_TENSORS = ("blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_q.weight")
INT8_ROWS = (512, 1024)
TORCH_SHAPES = ((1024, 1536, 256), (1024, 1024, 1024))  # (m, k, n): a few MB, in L3
MAX_CALLS = 500


@dataclass(frozen=True)
class Limits:
    threads: int
    bandwidth_gb_s: float
    buffer_bytes: int
    int8_gop_s: float | None  # None: the int8 kernels are not built
    fp32_gflop_s: float
    bf16_gflop_s: float
    detail: list[dict[str, Any]] = field(default_factory=list)  # every shape measured

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def best_seconds(fn: Callable[[], Any], repeats: int, min_s: float = 0.0) -> float:
    """The fastest of at least `repeats` timed calls (more, up to MAX_CALLS, until `min_s`
    seconds were spent: on a shared machine more calls give more chances of an undisturbed
    one), after one discarded call."""
    fn()
    best = float("inf")
    spent, calls = 0.0, 0
    while calls < repeats or (spent < min_s and calls < MAX_CALLS):
        started = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - started
        best, spent, calls = min(best, elapsed), spent + elapsed, calls + 1
    return best


def measure_bandwidth(buffer_gib: float, repeats: int) -> tuple[float, int]:
    """(GB/s, bytes): torch.sum over a resident fp32 buffer, best pass."""
    n = int(buffer_gib * (1 << 30)) // 4
    buffer = torch.empty(n, dtype=torch.float32)
    buffer.fill_(1.0)  # every page resident before timing
    seconds = best_seconds(buffer.sum, repeats)
    nbytes = buffer.numel() * 4
    return nbytes / seconds / 1e9, nbytes


def measure_int8(gguf_path: Path, repeats: int, min_s: float = 0.0) -> list[dict[str, Any]]:
    """GOP/s of ggml_linear's int8 path on INT8_TENSORS x INT8_ROWS (empty if not built)."""
    from engine.models.ggml_ref import FORMATS
    from engine.models.ggml_weight import GgmlTensor, GgmlWeight, ggml_linear, kernels_built
    from engine.tokenizer_gguf import read_gguf_tensors

    if not kernels_built(int8=True):
        log("int8 GGUF kernels not built: no int8 peak")
        return []
    tensors = read_gguf_tensors(gguf_path, copy_on_write=True)
    out = []
    generator = torch.Generator().manual_seed(0)
    for name in INT8_TENSORS:
        t = tensors.get(name)
        if t is None or t.tensor_type not in FORMATS or t.data.ndim != 2:
            continue
        # A private copy of the codes: resident, contiguous, apart from the memory map.
        codes = GgmlTensor.from_numpy(t.tensor_type, t.data.copy())
        weight = GgmlWeight((codes,))
        n, k = weight.shape
        for rows in INT8_ROWS:
            x = torch.randn(rows, k, generator=generator)
            seconds = best_seconds(functools.partial(ggml_linear, x, weight), repeats, min_s)
            out.append({"kind": "int8", "what": f"{name} {t.tensor_type.name}", "m": rows,
                        "n": n, "k": k, "weight_bytes": codes.data.numel(),
                        "gop_s": 2.0 * rows * n * k / seconds / 1e9})
    return out


def measure_torch_gemm(dtype: torch.dtype, repeats: int, min_s: float = 0.0
                       ) -> list[dict[str, Any]]:
    out = []
    for m, k, n in TORCH_SHAPES:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        seconds = best_seconds(functools.partial(torch.mm, a, b), repeats, min_s)
        out.append({"kind": str(dtype).removeprefix("torch."), "what": "torch.mm", "m": m,
                    "n": n, "k": k, "gop_s": 2.0 * m * n * k / seconds / 1e9})
    return out


def measure_limits(gguf_path: Path, *, quick: bool = False,
                   buffer_gib: float | None = None) -> Limits:
    """Every limit on THREADS threads (sets torch's thread count); ~15-25 s, ~5 s quick."""
    torch.set_num_threads(THREADS)
    repeats = 3 if quick else 7
    min_s = 0.3 if quick else 1.0  # per GEMM shape
    gib = buffer_gib if buffer_gib is not None else (1.0 if quick else 2.0)
    log(f"machine limits: bandwidth over {gib:g} GiB")
    bandwidth, nbytes = measure_bandwidth(gib, repeats)
    log("machine limits: int8 GEMM (ggml_linear), fp32 and bf16 GEMM (torch.mm)")
    int8 = measure_int8(gguf_path, repeats, min_s)
    fp32 = measure_torch_gemm(torch.float32, repeats, min_s)
    bf16 = measure_torch_gemm(torch.bfloat16, repeats, min_s)
    return Limits(
        threads=THREADS, bandwidth_gb_s=bandwidth, buffer_bytes=nbytes,
        int8_gop_s=max((d["gop_s"] for d in int8), default=None),
        fp32_gflop_s=max(d["gop_s"] for d in fp32), bf16_gflop_s=max(d["gop_s"] for d in bf16),
        detail=int8 + fp32 + bf16)


def weight_bytes_read(gguf_path: Path) -> int:
    """Bytes of the GGUF's tensors a decode step reads: all but token_embd (one row of it is
    gathered), unless the model has no output.weight (a tied lm_head reads all of it)."""
    from engine.tokenizer_gguf import read_gguf_tensors

    tensors = read_gguf_tensors(gguf_path)
    tied = "output.weight" not in tensors
    return sum(int(t.data.nbytes) for name, t in tensors.items()
               if tied or name != "token_embd.weight")


def kv_bytes_read(config: ModelConfig, kv_itemsize: float, context: int) -> float:
    """K and V bytes one decode step reads at `context` tokens (a sliding layer: its window)."""
    per_token = 2 * config.num_kv_heads * config.head_dim * kv_itemsize
    total = 0.0
    for i in range(config.num_layers):
        window = config.layer_window(i)
        total += per_token * (context if window is None else min(context, window))
    return total


def decode_bytes_per_token(weight_bytes: int, config: ModelConfig, kv_itemsize: float,
                           context: int) -> float:
    return weight_bytes + kv_bytes_read(config, kv_itemsize, context)


def prefill_ops(config: ModelConfig, num_tokens: int) -> float:
    """Operations (multiply-add = 2) of a cold prefill: projections, attention, one lm_head row."""
    return extend_flops(config, 0, num_tokens).total


def print_limits(limits: Limits, notes: dict[str, Any]) -> str:
    rows: list[list[Any]] = [["memory read bandwidth", f"torch.sum over "
                              f"{limits.buffer_bytes / (1 << 30):g} GiB fp32",
                              f"{limits.bandwidth_gb_s:.1f} GB/s", notes["cpu_class"]]]
    for d in limits.detail:
        rows.append([f"{d['kind']} GEMM", f"{d['what']} {d['m']}x{d['k']} @ {d['k']}x{d['n']}",
                     f"{d['gop_s']:.1f} G{'OP' if d['kind'] == 'int8' else 'FLOP'}/s",
                     notes["cpu_class"]])
    table = format_table(["limit", "how (best of repeats)", f"{THREADS} threads", "CPU"], rows)
    peak = "-" if limits.int8_gop_s is None else f"{limits.int8_gop_s:.1f} GOP/s"
    table += (f"\nint8 peak {peak}; fp32 {limits.fp32_gflop_s:.1f} GFLOP/s; bf16 "
              f"{limits.bf16_gflop_s:.1f} GFLOP/s\n" + load_line(notes))
    return table


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limits = result["limits"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), width_ratios=(1, 4))
    ax1.bar(["read"], [limits["bandwidth_gb_s"]])
    ax1.set(ylabel="GB/s", title="Memory bandwidth")
    labels = [f"{d['kind']}\n{d['what'].split('.')[-2] if d['kind'] == 'int8' else ''}"
              f"\n{d['m']}x{d['k']}x{d['n']}" for d in limits["detail"]]
    ax2.bar(range(len(labels)), [d["gop_s"] for d in limits["detail"]])
    ax2.set_xticks(range(len(labels)), labels, fontsize=7)
    ax2.set(ylabel="GOP/s (int8) or GFLOP/s", title="GEMM peaks")
    fig.suptitle(f"{result['notes']['cpu_class']}, {THREADS} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b",
                        help="whose GGUF tensors the int8 GEMM runs on")
    parser.add_argument("--json", type=Path, default=Path("bench-results/machine_limits.json"))
    parser.add_argument("--buffer-gib", type=float, default=None)
    parser.add_argument("--quick", action="store_true", help="1 GiB, 3 repeats")
    args = parser.parse_args()
    from engine.models.locate import resolve_model_path

    path = resolve_model_path(args.model)
    notes = machine_notes(path)
    limits = measure_limits(path, quick=args.quick, buffer_gib=args.buffer_gib)
    finish_notes(notes)
    result = {"notes": notes, "limits": limits.as_json()}
    print(print_limits(limits, notes))
    write_json(args.json, result)
    plot(result, plot_path(args.json))


if __name__ == "__main__":
    main()
