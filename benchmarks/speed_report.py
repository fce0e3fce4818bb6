"""model_speed's tables, targets and plot.

Limits: decode's ceiling is bandwidth / bytes read per token (the GGUF's quantised weights but
token_embd, plus K and V at the context: at the middle of the decoded tokens) and batch 8's is 8
tokens per such read of the weights (plus 8 contexts of KV); prefill's is the int8 GEMM peak over
its operations per token (projections, attention, the last row's lm_head). Only rows that run
the GGUF's codes get decode fractions (dense rows read other bytes). Peers' KV is counted at
their defaults: llama.cpp f16, OpenVINO GenAI u8.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import format_table, load_line, log
from benchmarks.machine_limits import decode_bytes_per_token, prefill_ops, weight_bytes_read
from benchmarks.targets import Target, cell, format_targets, ratio_of
from engine.config import ModelConfig

PREFILL_BOUND = 1.2  # radixgate's cold prefill over the faster peer's
DECODE_BOUND = 1.0
BATCH_BOUND = 4.0  # batch-8 aggregate over batch 1
READY_BOUND_S = 10.0
RSS_FILE_FACTOR = 1.3  # peak RSS <= 1.3 x file + KV pool
MIB = 1 << 20


def _median(stats: dict[str, Any], name: str, key: str | None = None) -> float | None:
    per = stats.get(name)
    if per is None:
        return None
    value = per[key] if key is not None else per
    return float(value["median"])


def fractions(result: dict[str, Any], path: Path, config: ModelConfig) -> dict[str, Any]:
    limits = result["limits"]
    bandwidth = limits["bandwidth_gb_s"] * 1e9
    peak = limits["int8_gop_s"]
    weights = weight_bytes_read(path)
    shapes = result["shapes"]
    mid = shapes["decode_tokens"] // 2
    batch = shapes["batch_size"]
    out: dict[str, Any] = {"weight_bytes_per_token": weights}
    for name in result["decode_tok_s"]:
        row: dict[str, float] = {}
        itemsize = result["kv_itemsize"].get(name)
        if itemsize and not name.endswith("dense") and name != "radixgate-bf16":
            for key, ctx in (("short", 64 + mid), ("long", shapes["long_decode_context"] + mid)):
                per_token = decode_bytes_per_token(weights, config, itemsize, ctx)
                rate = _median(result["decode_long_tok_s" if key == "long" else "decode_tok_s"],
                               name)
                row[f"decode_{key}_bytes_per_token"] = per_token
                row[f"decode_{key}_ceiling_tok_s"] = bandwidth / per_token
                row[f"decode_{key}_of_bandwidth"] = (rate or 0.0) * per_token / bandwidth
            agg = _median(result["batch_decode_tok_s"], name)
            if agg is not None:
                per_step = decode_bytes_per_token(weights, config, itemsize * batch, 64 + mid)
                row["batch_ceiling_tok_s"] = batch * bandwidth / per_step
                row["batch_of_bandwidth"] = agg / row["batch_ceiling_tok_s"]
        if peak:
            for n, stats in result["prefill_tok_s"][name].items():
                ceiling = peak * 1e9 / (prefill_ops(config, int(n)) / int(n))
                row[f"prefill_{n}_ceiling_tok_s"] = ceiling
                row[f"prefill_{n}_of_int8_peak"] = stats["median"] / ceiling
        out[name] = row
    return out


def _faster_peer(stats: dict[str, Any], peers: list[str], key: str | None = None
                 ) -> tuple[str | None, float | None]:
    best: tuple[str | None, float | None] = (None, None)
    for peer in peers:
        value = _median(stats, peer, key)
        if value is not None and (best[1] is None or value > best[1]):
            best = (peer, value)
    return best


def _versus(mine: float | None, peer: str | None, theirs: float | None, digits: int) -> str:
    """"19.10 vs llama.cpp 16.00 tok/s", or "19.10 tok/s; no peer ran"."""
    head = "-" if mine is None else f"{mine:.{digits}f}"
    if peer is None or theirs is None:
        return f"{head} tok/s; no peer ran"
    return f"{head} vs {peer} {theirs:.{digits}f} tok/s"


def targets(result: dict[str, Any]) -> list[Target]:
    me = "radixgate-default"
    peers = result["peers"]
    out = []
    cells = [("decode b1, short prompt", result["decode_tok_s"], None),
             (f"decode b1 after {result['shapes']['long_decode_context']} tokens",
              result["decode_long_tok_s"], None)]
    for label, stats, key in cells:
        peer, theirs = _faster_peer(stats, peers, key)
        mine = _median(stats, me, key)
        out.append(Target(f"{label}: radixgate / faster peer", _versus(mine, peer, theirs, 2),
                          ratio_of(mine, theirs), DECODE_BOUND))
    for n in result["shapes"]["prefill"]:
        if n < 2048:
            continue
        peer, theirs = _faster_peer(result["prefill_tok_s"], peers, str(n))
        mine = _median(result["prefill_tok_s"], me, str(n))
        out.append(Target(f"prefill {n} cold: radixgate / faster peer",
                          _versus(mine, peer, theirs, 1), ratio_of(mine, theirs), PREFILL_BOUND))
    agg, one = _median(result["batch_decode_tok_s"], me), _median(result["decode_tok_s"], me)
    out.append(Target(f"batch {result['shapes']['batch_size']} aggregate / batch 1 decode",
                      f"{agg or 0:.2f} vs {one or 0:.2f} tok/s", ratio_of(agg, one), BATCH_BOUND))
    ready = result["ready"].get(me, {})
    if "ready_s" in ready:
        out.append(Target("ready: process start to first token possible (s)",
                          f"{ready['ready_s']['median']:.2f} s (model load "
                          f"{ready['load_s']['median']:.2f} s)", ready["ready_s"]["median"],
                          READY_BOUND_S, at_most=True, note="warm page cache"))
        bound = RSS_FILE_FACTOR * result["file_bytes"] + ready["kv_bytes"]
        rss = ready["peak_rss_bytes"]["median"]
        out.append(Target("peak RSS / (1.3 x file + KV pool)", f"{rss / MIB:.0f} MiB vs 1.3 x "
                          f"{result['file_bytes'] / MIB:.0f} + {ready['kv_bytes'] / MIB:.0f} "
                          "MiB", rss / bound, 1.0, at_most=True))
    return out


def _speed_table(result: dict[str, Any]) -> str:
    lens = result["shapes"]["prefill"]
    long_ctx = result["shapes"]["long_decode_context"]
    rows = []
    for name, per in result["prefill_tok_s"].items():
        agg = result["batch_decode_tok_s"].get(name)
        one = result["decode_tok_s"][name]
        rows.append([name, *(cell(per[str(n)]) for n in lens), cell(one, 2),
                     cell(result["decode_long_tok_s"][name], 2), cell(agg, 2),
                     "-" if agg is None else f"{agg['median'] / one['median']:.2f}x"])
    return format_table(["engine", *(f"prefill@{n} tok/s" for n in lens), "decode b1 tok/s",
                         f"decode b1 @{long_ctx}", "batch-8 agg tok/s", "b8/b1"], rows)


def _ratio_table(result: dict[str, Any]) -> str:
    lens = result["shapes"]["prefill"]
    bases = [n for n in ("radixgate-fp32-dense", *result["peers"]) if n in result["decode_tok_s"]]
    if not bases:
        return "(none: no peer ran and no dense reference row)"
    headers = ["engine"]
    for base in bases:
        headers += [*(f"prefill@{n} / {base}" for n in lens), f"decode / {base}",
                    f"decode@long / {base}"]
    rows = []
    for name in result["prefill_tok_s"]:
        row: list[Any] = [name]
        for base in bases:
            row += [ratio_of(_median(result["prefill_tok_s"], name, str(n)),
                             _median(result["prefill_tok_s"], base, str(n))) for n in lens]
            row += [ratio_of(_median(result[k], name), _median(result[k], base))
                    for k in ("decode_tok_s", "decode_long_tok_s")]
        rows.append(row)
    return format_table(headers, rows)


def _limits_table(result: dict[str, Any]) -> str:
    lens = result["shapes"]["prefill"]
    rows = []
    for name, f in result["fractions"].items():
        if name == "weight_bytes_per_token":
            continue
        pct = [f"{f[k]:.0%} of {f[c]:.1f}" if k in f else "-"
               for k, c in (("decode_short_of_bandwidth", "decode_short_ceiling_tok_s"),
                            ("decode_long_of_bandwidth", "decode_long_ceiling_tok_s"),
                            ("batch_of_bandwidth", "batch_ceiling_tok_s"))]
        pct += [f"{f[f'prefill_{n}_of_int8_peak']:.0%} of {f[f'prefill_{n}_ceiling_tok_s']:.0f}"
                if f"prefill_{n}_of_int8_peak" in f else "-" for n in lens]
        rows.append([name, *pct])
    return format_table(["engine (fraction of ceiling tok/s)", "decode b1 vs bandwidth",
                         "decode@long vs bandwidth", "batch-8 vs bandwidth",
                         *(f"prefill@{n} vs int8 peak" for n in lens)], rows)


def _ready_table(result: dict[str, Any]) -> str:
    rows = []
    for name, r in result["ready"].items():
        if "error" in r:
            rows.append([name, f"failed: {r['error'][:80]}", "", "", "", "", "", ""])
            continue
        bound = RSS_FILE_FACTOR * result["file_bytes"] + r["kv_bytes"]
        rss = r["peak_rss_bytes"]
        rows.append([name, cell(r["ready_s"], 2), cell(r["load_s"], 2), cell(r["startup_s"], 2),
                     cell(r["first_token_s"], 2), f"{rss['median'] / MIB:.0f}",
                     f"{r['kv_bytes'] / MIB:.0f}", f"{rss['median'] / bound:.2f}"])
    return format_table(["engine (fresh process)", "ready s", "model load s",
                         "interpreter+imports s", "first token s", "peak RSS MiB", "KV MiB",
                         "RSS / (1.3 file + KV)"], rows)


def report(result: dict[str, Any], path: Path, config: ModelConfig) -> None:
    """Add "fractions" and "targets" to `result` and print every table."""
    result["fractions"] = fractions(result, path, config)
    found = targets(result)
    result["targets"] = [t.as_json() for t in found]
    notes, limits = result["notes"], result["limits"]
    cpu = notes["cpu_class"]
    print(f"\n{result['model']} ({result['file_bytes'] / MIB:.0f} MiB), {cpu}, "
          f"{notes['threads']} threads; medians of {result['repeats']} [min-max]")
    print(_speed_table(result))
    print("\nRatios (same run)")
    print(_ratio_table(result))
    int8 = limits["int8_gop_s"]
    print(f"\nAgainst this machine's limits: read bandwidth {limits['bandwidth_gb_s']:.1f} GB/s, "
          f"int8 GEMM peak {'-' if int8 is None else f'{int8:.0f}'} GOP/s "
          f"(fp32 {limits['fp32_gflop_s']:.0f}, bf16 {limits['bf16_gflop_s']:.0f} GFLOP/s); "
          f"weights read per decoded token "
          f"{result['fractions']['weight_bytes_per_token'] / MIB:.0f} MiB")
    print(_limits_table(result))
    if any(v > 1.0 for row in result["fractions"].values() if isinstance(row, dict)
           for k, v in row.items() if k.endswith(("_of_bandwidth", "_of_int8_peak"))):
        print("NOTE: a fraction above 100% means that limit was measured low (a loaded "
              "machine disturbs its short timed calls): rerun on a quiet machine")
    batch = result["shapes"]["batch_size"]
    scaling = [ratio_of(_median(result["batch_decode_tok_s"], n),
                        _median(result["decode_tok_s"], n)) for n in result["batch_decode_tok_s"]]
    if any((x or 0.0) > batch for x in scaling):
        print(f"NOTE: batch-{batch} aggregate above {batch}x batch 1: batch-1 steps waited on "
              f"a starved thread (a loaded machine); rerun on a quiet one")
    if result["ready"]:
        print("\nReady time and peak memory (fresh processes, warm page cache)")
        print(_ready_table(result))
    print(f"\nTargets ({cpu})")
    print(format_targets(found, cpu))
    for name, label in result["precision"].items():
        print(f"{name}: {label}")
    for name, lens in result["prefill_cached_len"].items():
        if name in result["peers"]:
            seen = "unknown (no API reports it)" if all(v is None for v in lens) else lens
            print(f"{name} prefill: prompt tokens reused from its cache {seen}: every prompt "
                  "starts on a token no earlier prompt started with, so none can match")
    for note in result["peers_skipped"]:
        print(f"peer skipped: {note}")
    print(load_line(notes))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, per in result["prefill_tok_s"].items():
        lens = [int(n) for n in per]
        ax1.plot(lens, [per[str(n)]["median"] for n in lens], marker="o", label=name)
    ax1.set(xlabel="prompt tokens", ylabel="prefill tokens/s", title="Cold prefill")
    ax1.legend(fontsize=8)
    names = list(result["decode_tok_s"])
    xs = range(len(names))
    series = [("decode_tok_s", "b1, short prompt"),
              ("decode_long_tok_s", f"b1 after {result['shapes']['long_decode_context']}"),
              ("batch_decode_tok_s", f"batch {result['shapes']['batch_size']} aggregate")]
    for i, (key, label) in enumerate(series):
        ax2.bar([x + (i - 1) * 0.27 for x in xs],
                [result[key].get(n, {"median": 0})["median"] for n in names], 0.27, label=label)
    ax2.set_xticks(list(xs), names)
    ax2.set(ylabel="tokens/s", title="Decode")
    ax2.legend(fontsize=8)
    ax2.tick_params(axis="x", rotation=20, labelsize=8)
    fig.suptitle(f"{result['model']}: {result['notes']['cpu_class']}, "
                 f"{result['notes']['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")
