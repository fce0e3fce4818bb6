"""Prefill, decode, batch-8 decode, ready time and peak memory of radixgate against its peers on
one GGUF, with the machine's limits and the issue's targets as PASS/FAIL ratios.

    python -m benchmarks.model_speed [--model qwen2.5-coder-1.5b] [--repeats 5] [--quick]
        [--json bench-results/model_speed.json] [--no-peers] [--no-ready]

Every engine runs in this one process on the same GGUF, the same token ids and 2 threads, taking
turns (never concurrently) in an order that starts one engine later each repeat; each cell is
the median of `--repeats` (default 5) with min and max, after one discarded warm-up per engine
and shape. Cells (benchmarks.speed_cells): cold prefill tokens/s (prefix cache off; 2048 / 8192
tokens for a 32k-context model, 512 / 2048 / 8000 for the 8k SmolLM2), batch-1 greedy decode
tokens/s after a short prompt and after a long one (8192 / 4000 tokens), EOS ignored, no
drafting, and radixgate's aggregate batch-8 decode. Ready time and peak RSS come from fresh
processes (benchmarks.ready_probe); model load is reported apart. `benchmarks.machine_limits`
measures memory bandwidth and the int8 GEMM peak first: decode is printed as a fraction of
bandwidth / (weight + KV bytes per token), prefill as a fraction of the int8 peak over its
operations (benchmarks.speed_report).

radixgate variants: the default (`--dtype auto`: GGUF codes on the int8 path) and fp32 (codes on
the fp32 path). For a small model (SmolLM2) also the dense fp32 reference (`packed=False`) and,
on a CPU with bf16 instructions, bf16 and mixed-dense; a model whose dequantised weights would
not fit comfortably (the 1.5B) gets no dense rows. `--quick` is a smoke check of the harness
(the packed rows, 512 / 2048-token prefill, decode after 2048, one repeat), not a result.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    THREADS,
    finish_notes,
    log,
    machine_notes,
    median_of,
    model_tag,
    plot_path,
    precision_label,
    write_json,
)
from benchmarks.machine_limits import measure_limits
from benchmarks.ready_probe import PROMPT_TOKENS, measure_ready
from benchmarks.speed_cells import (
    BATCH,
    WINDOW_STRIDE,
    PeerCells,
    RadixVariant,
    Shapes,
    Windows,
    corpus_ids,
    shapes_for,
)
from benchmarks.speed_report import plot, report
from engine.models.loader import cpu_has_bf16, default_dtype, load_model
from engine.models.locate import resolve_model_path
from engine.tokenizer import Tokenizer
from engine.tokenizer_gguf import read_gguf_metadata

__all__ = ["corpus_ids", "main", "run"]  # corpus_ids: tests take prompts from it

DEFAULT_MODEL = "smollm2-135m"
DENSE_MAX_FILE_BYTES = 300 << 20  # dense rows only where the dequantised copy is small


def context_length(path: Path) -> int:
    meta = read_gguf_metadata(path)
    return int(meta.get(f"{meta.get('general.architecture')}.context_length", 8192))


def variant_specs(path: Path, context: int, quick: bool = False) -> list[tuple[str, str, bool]]:
    """(name, dtype, packed) of the radixgate rows (see the module docstring); `quick`: the
    packed rows only (default and fp32)."""
    default = default_dtype("cpu")
    specs = [("default", default, True)]
    if default != "fp32":
        specs.append(("fp32", "fp32", True))
    if not quick and path.stat().st_size <= DENSE_MAX_FILE_BYTES and context <= 8192:
        specs.append(("fp32-dense", "fp32", False))
        if cpu_has_bf16():
            specs += [("bf16", "bf16", False), ("mixed-dense", "mixed", False)]
    return specs


def ready_probes(path: Path, context: int, prompt: list[int], with_peers: bool,
                 kv_per_token_f16: int, fp32: bool) -> dict[str, list[str]]:
    common = ["--model", str(path), "--threads", str(THREADS),
              "--prompt", ",".join(map(str, prompt))]
    probes = {"radixgate-default": ["radixgate", "--dtype", default_dtype("cpu"), *common]}
    if fp32:
        probes["radixgate-fp32"] = ["radixgate", "--dtype", "fp32", *common]
    if with_peers and importlib.util.find_spec("llama_cpp") is not None:
        probes["llama.cpp"] = ["llama.cpp", "--n-ctx", str(context), "--kv-bytes",
                               str(context * kv_per_token_f16), *common]
    if with_peers and importlib.util.find_spec("openvino_genai") is not None:
        probes["openvino-genai"] = ["openvino-genai", *common]
    return probes


def kv_budget(loaded: Any, tokens: int) -> int:
    """KV pool bytes for `tokens` tokens plus slack (pools are zero-filled: all resident)."""
    config = loaded.model.config
    itemsize = torch.empty((), dtype=loaded.model.kv_dtype).element_size()
    per_token = 2 * config.num_layers * config.kv_size * itemsize
    return max(64 << 20, int(per_token * (tokens + 2048) * 1.25))


def time_cells(runners: list[Any], variants: list[RadixVariant], windows: Windows,
               shapes: Shapes, repeats: int, quick: bool = False) -> dict[str, Any]:
    """Warm-up, then `repeats` rounds of every cell, engines in rotating order. `quick` warms
    each engine up on the shortest prefill and the short decode only (first-call costs; the
    decode rate leaves the long prompt's prefill out either way)."""
    n_tok = shapes.decode_tokens
    decode_prompts = {"short": windows.take(64), "long": windows.take(shapes.long_context)}
    batch_prompts = [windows.take(64) for _ in range(BATCH)]
    names = [r.name for r in runners]
    prefill: dict[str, dict[int, list[float]]] = {n: {s: [] for s in shapes.prefill}
                                                  for n in names}
    decode: dict[str, dict[str, list[float]]] = {n: {"short": [], "long": []} for n in names}
    batch: dict[str, list[float]] = {v.name: [] for v in variants}
    cached: dict[str, list[int | None]] = {n: [] for n in names}
    warm_prompts = [windows.take(n) for n in shapes.prefill[: 1 if quick else None]]
    warm_decodes = [decode_prompts["short"]] if quick else list(decode_prompts.values())
    for runner in runners:  # one discarded run per engine and shape
        log(f"warm-up: {runner.name}")
        for ids in warm_prompts:
            runner.prefill_tok_s(ids)
        for ids in warm_decodes:
            runner.decode_tok_s(ids, n_tok)
    for variant in variants:
        variant.batch_decode_tok_s(batch_prompts, n_tok)
    for r in range(repeats):
        order = runners[r % len(runners):] + runners[:r % len(runners)]
        for n in shapes.prefill:
            ids = windows.take(n)
            for runner in order:
                log(f"prefill {n}: {runner.name} (repeat {r + 1}/{repeats})")
                prefill[runner.name][n].append(runner.prefill_tok_s(ids))
                cached[runner.name].append(runner.last_cached_len)
        for kind, ids in decode_prompts.items():
            for runner in order:
                log(f"decode after {len(ids)} tokens: {runner.name} (repeat {r + 1}/{repeats})")
                decode[runner.name][kind].append(runner.decode_tok_s(ids, n_tok))
        for variant in [v for v in order if isinstance(v, RadixVariant)]:
            log(f"batch-{BATCH} decode: {variant.name} (repeat {r + 1}/{repeats})")
            batch[variant.name].append(variant.batch_decode_tok_s(batch_prompts, n_tok))
    return {"prefill": prefill, "decode": decode, "batch": batch, "cached": cached}


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    repeats = 1 if args.quick and args.repeats is None else (args.repeats or 5)
    path = resolve_model_path(args.model)
    context = context_length(path)
    shapes = shapes_for(context, args.quick)
    notes = machine_notes(path)  # hashing the GGUF also warms the page cache
    limits = measure_limits(path, quick=args.quick)
    tokenizer = Tokenizer.from_gguf(path)
    variants_spec = variant_specs(path, context, quick=args.quick and not args.variants)
    if args.variants:
        keep = set(args.variants.split(","))
        variants_spec = [v for v in variants_spec if v[0] in keep or v[0] == "default"]
    log(f"loading {path.name}: {', '.join(name for name, _, _ in variants_spec)}")
    loaded_default = load_model(str(path), variants_spec[0][1], show_progress=False)
    config = loaded_default.model.config
    ready: dict[str, Any] = {}
    if not args.no_ready:
        probes = ready_probes(path, context, corpus_ids(tokenizer, PROMPT_TOKENS),
                              not args.no_peers, 2 * config.num_layers * config.kv_size * 2,
                              not args.quick and any(n == "fp32" for n, _, _ in variants_spec))
        ready = measure_ready(probes, repeats, warmup=not args.quick)
    longest = max(*shapes.prefill, shapes.long_context) + shapes.decode_tokens
    variants = []
    for name, dtype, packed in variants_spec:
        loaded = loaded_default if name == "default" else load_model(
            str(path), dtype, packed=packed, show_progress=False)
        variants.append(RadixVariant(f"radixgate-{name}", loaded, precision_label(loaded),
                                     kv_budget(loaded, longest)))
    skipped: list[str] = []
    peers: list[Any] = []
    if not args.no_peers:
        from benchmarks.peers.registry import available_peers

        peers = available_peers(path, THREADS, skipped=skipped,
                                context_len=longest + 64 if context > 8192 else None)
    runners: list[Any] = [*variants, *(PeerCells(p) for p in peers)]
    windows_needed = 3 + BATCH + (repeats + 1) * len(shapes.prefill)  # + warm-ups
    corpus = corpus_ids(tokenizer, windows_needed * WINDOW_STRIDE + longest + 1000)
    cells = time_cells(runners, variants, Windows(corpus), shapes, repeats, args.quick)
    finish_notes(notes)
    label = shapes.long_label
    decode_long = {n: median_of(v["long"]) for n, v in cells["decode"].items()}
    result: dict[str, Any] = {
        "notes": notes, "model": loaded_default.name, "file_bytes": path.stat().st_size,
        "context_len": context, "repeats": repeats,
        "shapes": {"prefill": list(shapes.prefill), "long_decode_context": shapes.long_context,
                   "decode_tokens": shapes.decode_tokens, "batch_size": BATCH},
        "precision": {v.name: v.label for v in variants},
        "kv_itemsize": {**{v.name: v.kv_itemsize for v in variants},
                        "llama.cpp": 2, "openvino-genai": 1},  # peers: f16 and u8 KV
        "prefill_tok_s": {name: {str(n): median_of(v) for n, v in per.items()}
                          for name, per in cells["prefill"].items()},
        "decode_tok_s": {n: median_of(v["short"]) for n, v in cells["decode"].items()},
        f"decode_{label}_tok_s": decode_long, "decode_long_tok_s": decode_long,
        "batch_decode_tok_s": {n: median_of(v) for n, v in cells["batch"].items()},
        "prefill_cached_len": cells["cached"],
        "ready": ready, "limits": limits.as_json(),
        "peers": [p.name for p in peers], "peers_skipped": skipped,
        "peers_missing": [] if peers or args.no_peers else ["llama.cpp", "openvino-genai"],
    }
    # Kept for the README's tables: the default's precision under the old key.
    notes["precision"] = variants[0].label
    report(result, path, config)
    for peer in peers:
        peer.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="a --model name or GGUF path (the target: qwen2.5-coder-1.5b)")
    parser.add_argument("--json", type=Path, default=None,
                        help="default bench-results/model_speed[-MODEL].json")
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (1 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke check: 1 repeat, shorter shapes, the packed rows only, "
                             "a one-shape warm-up, one ready probe (radixgate's default)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated radixgate rows to time besides the default, e.g. "
                             "fp32 (default: all of this model's)")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--no-ready", action="store_true", help="skip the fresh-process probes")
    args = parser.parse_args()
    json_path = args.json or Path(
        "bench-results/model_speed"
        f"{'' if args.model == DEFAULT_MODEL else '-' + model_tag(args.model)}.json")
    result = run(args)
    write_json(json_path, result)
    plot(result, plot_path(json_path))


if __name__ == "__main__":
    main()
