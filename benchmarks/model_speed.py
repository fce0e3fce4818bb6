"""Prefill and decode speed of the engine on the embedded GGUF, with peers.

    python -m benchmarks.model_speed --json bench-results/model_speed.json [--quick]

Prefill: cold TTFT of one prompt of 512 / 2048 / 8000 tokens (prefix cache off), as tokens/s.
Decode: batch-1 greedy tokens/s after a short prompt and after a 4k-token one (attention reads
4k tokens of KV per step), EOS ignored, no speculative drafting. Every engine runs in this one
process, in turns, on the same token ids and thread count; medians over repeats.

Engines: radixgate's default mode (`--dtype auto`: fp32 here, with decode and verification
rows on the GGUF's packed Q4_1/Q8_0 codes and extends on oneDNN-packed weights), the dense fp32
reference (`--no-packed-weights`), and on a CPU with bf16 instructions also bf16 and `mixed`
(bf16 projections over fp32 norms, attention, lm_head and KV; the default there). Without
those instructions torch's bf16 GEMMs are many times slower than fp32, so those rows are
skipped and the notes say so.
"""

from __future__ import annotations

import argparse
import inspect
import json
import uuid
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
    median_of,
    plot_path,
    precision_label,
    write_json,
)
from engine.engine import Engine, EngineConfig
from engine.models.loader import cpu_has_bf16, default_dtype, load_model
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

PREFILL_LENS = (512, 2048, 8000)
DECODE_TOKENS = 64
LONG_DECODE_CONTEXT = 4000


def corpus_ids(tokenizer: Any, num_tokens: int) -> list[int]:
    """Deterministic real text: standard-library sources, tokenised and cut to length."""
    import collections
    import difflib
    import textwrap

    text = "".join(inspect.getsource(m) for m in (json, difflib, textwrap, collections))
    ids: list[int] = tokenizer.encode(text)
    assert len(ids) >= num_tokens, "corpus too short"
    return ids[:num_tokens]


def engine_ttft(engine: Engine, ids: list[int], max_tokens: int) -> Finished:
    engine.submit(Extend(uuid.uuid4().hex, "bench", None, ids,
                         SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    finished = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
    return finished[0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    repeats = 1 if args.quick else args.repeats
    lens = (512, 2048) if args.quick else PREFILL_LENS
    engines: dict[str, Any] = {}
    default = default_dtype("cpu")
    default_label = default
    variants = [("default", default, True), ("fp32-dense", "fp32", False)]
    if default != "fp32":  # the packed fp32 path (oneDNN extends) beside the default's
        variants.append(("fp32", "fp32", True))
    if cpu_has_bf16():
        variants += [("bf16", "bf16", False), ("mixed-dense", "mixed", False)]
    for name, dtype, packed in variants:
        loaded = load_model(None, dtype, packed=packed)
        # No drafting: the peers' plain pipelines do not speculate either (spec_decode.py
        # measures drafting against OpenVINO's prompt lookup).
        engines[f"radixgate-{name}"] = Engine(loaded, EngineConfig(
            enable_prefix_cache=False, kv_memory_bytes=1 << 30, max_batch_tokens=2048,
            spec="none"))
        if name == "default":
            default_label = precision_label(loaded)
    tokenizer = loaded.tokenizer
    notes = machine_notes(loaded.path)
    notes["precision"] = default_label
    if not cpu_has_bf16():
        notes["skipped"] = "bf16 and mixed rows: this CPU has no bf16 instructions"
    peers = []
    if not args.no_peers:
        from benchmarks.peers.registry import available_peers

        peers = available_peers(loaded.path, THREADS)
    prompts = {n: corpus_ids(tokenizer, n) for n in lens}
    decode_prompts = {"short": prompts[512][:64],
                      "4k": corpus_ids(tokenizer, LONG_DECODE_CONTEXT)}
    prefill: dict[str, dict[int, list[float]]] = {}
    decode: dict[str, dict[str, list[float]]] = {}
    names = list(engines) + [p.name for p in peers]
    for name in names:
        prefill[name] = {n: [] for n in lens}
        decode[name] = {kind: [] for kind in decode_prompts}
    # Warm-up: one discarded run per engine at the smallest shape pays first-call costs.
    for name, engine in engines.items():
        log(f"warm-up: {name}")
        engine_ttft(engine, prompts[lens[0]], 2)
    for peer in peers:
        log(f"warm-up: {peer.name}")
        peer.prefill_tok_s(prompts[lens[0]])
    for repeat in range(repeats):
        for n in lens:
            for name, engine in engines.items():
                log(f"prefill {n} tokens: {name} (repeat {repeat + 1}/{repeats})")
                f = engine_ttft(engine, prompts[n], 1)
                prefill[name][n].append(n / f.timings.ttft_s)
            for peer in peers:
                log(f"prefill {n} tokens: {peer.name} (repeat {repeat + 1}/{repeats})")
                prefill[peer.name][n].append(peer.prefill_tok_s(prompts[n]))
        for kind, ids in decode_prompts.items():
            for name, engine in engines.items():
                log(f"decode after {kind} prompt: {name} (repeat {repeat + 1}/{repeats})")
                f = engine_ttft(engine, ids, DECODE_TOKENS)
                decode[name][kind].append((f.output_len - 1) / f.timings.decode_s)
            for peer in peers:
                log(f"decode after {kind} prompt: {peer.name} (repeat {repeat + 1}/{repeats})")
                decode[peer.name][kind].append(peer.decode_tok_s(ids, DECODE_TOKENS))
    finish_notes(notes)
    result = {
        "notes": notes,
        "prefill_tok_s": {name: {str(n): median_of(v) for n, v in per.items()}
                          for name, per in prefill.items()},
        "decode_tok_s": {name: median_of(per["short"]) for name, per in decode.items()},
        "decode_4k_tok_s": {name: median_of(per["4k"]) for name, per in decode.items()},
        "peers_missing": [] if peers or args.no_peers else ["llama.cpp", "openvino-genai"],
    }
    print_table(result, lens)
    return result


def print_table(result: dict[str, Any], lens: tuple[int, ...]) -> None:
    # Ratios against the dense fp32 reference and against OpenVINO GenAI (the closest peer).
    bases = ["radixgate-fp32-dense"] + [n for n in result["prefill_tok_s"]
                                        if n.startswith("openvino")]
    headers = ["engine", *[f"prefill@{n} tok/s" for n in lens], "decode b1 tok/s",
               "decode@4k tok/s"]
    for base in bases:
        headers += [f"prefill@{lens[-1]} vs {base}", f"decode vs {base}",
                    f"decode@4k vs {base}"]
    rows = []
    for name, per in result["prefill_tok_s"].items():
        pre = [per[str(n)]["median"] for n in lens]
        dec = result["decode_tok_s"][name]["median"]
        dec4k = result["decode_4k_tok_s"][name]["median"]
        row = [name, *pre, dec, dec4k]
        for base in bases:
            row += [pre[-1] / result["prefill_tok_s"][base][str(lens[-1])]["median"],
                    dec / result["decode_tok_s"][base]["median"],
                    dec4k / result["decode_4k_tok_s"][base]["median"]]
        rows.append(row)
    print(format_table(headers, rows))
    print(f"radixgate-default: {result['notes'].get('precision')}")
    if "skipped" in result["notes"]:
        print(f"skipped: {result['notes']['skipped']}")
    print(load_line(result["notes"]))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, per in result["prefill_tok_s"].items():
        lens = [int(n) for n in per]
        ax1.plot(lens, [per[str(n)]["median"] for n in lens], marker="o", label=name)
    ax1.set(xlabel="prompt tokens", ylabel="prefill tokens/s", title="Cold prefill")
    ax1.legend()
    names = list(result["decode_tok_s"])
    xs = range(len(names))
    ax2.bar([x - 0.2 for x in xs], [result["decode_tok_s"][n]["median"] for n in names], 0.4,
            label="short prompt")
    ax2.bar([x + 0.2 for x in xs], [result["decode_4k_tok_s"][n]["median"] for n in names], 0.4,
            label=f"after {LONG_DECODE_CONTEXT} tokens")
    ax2.set_xticks(list(xs), names)
    ax2.set(ylabel="tokens/s", title="Batch-1 decode")
    ax2.legend()
    ax2.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=Path("bench-results/model_speed.json"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repeat, 512/2048 tokens only")
    parser.add_argument("--no-peers", action="store_true")
    args = parser.parse_args()
    result = run(args)
    write_json(args.json, result)
    plot(result, plot_path(args.json))


if __name__ == "__main__":
    main()
