"""Replay an agent trajectory through the engine with the prefix cache on and off, plus peers.

    python -m benchmarks.agent_replay --json bench-results/agent_replay.json [--quick]
    python -m benchmarks.agent_replay --api openai|anthropic [--turns N]  (benchmarks.api_replay)

Per turn: context length, delta length, TTFT with the cache (only the delta is computed) and
without it (the whole context is recomputed), and each installed peer's TTFT with its own prefix
caching. Then a fixed-delta sweep: 256 new tokens appended at 1k, 2k, 4k and 7.5k of context.
Prints the tables, writes JSON and a PNG plot of TTFT against context length.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    THREADS,
    finish_notes,
    format_table,
    load_default_model,
    load_line,
    log,
    machine_notes,
    plot_path,
    precision_label,
    write_json,
)
from benchmarks.replay_plot import plot
from benchmarks.workload import agent_trajectory, stdlib_source
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

MAX_CONTEXT = 7600
SWEEP_CONTEXTS = (1000, 2000, 4000, 7500)
SWEEP_DELTA = 256
PREFIX_STRIDE = 997  # tokens between the starts of successive repeats' prefixes
# SmolLM2-135M arithmetic: FLOPs per new token in the linear layers, and per (new, cached) pair
# in attention (performance.md §2a).
LINEAR_FLOP_PER_TOKEN = 212e6
ATTN_FLOP_PER_PAIR = 69_120


def predicted_ratio(context_hi: int, context_lo: int, delta: int) -> float:
    """Compute for a `delta`-token extend at context_hi over context_lo (same delta)."""
    def flops(c: int) -> float:
        return delta * (LINEAR_FLOP_PER_TOKEN + ATTN_FLOP_PER_PAIR * (c + delta / 2))
    return flops(context_hi) / flops(context_lo)


def ttft(engine: Engine, ids: list[int]) -> Finished:
    """One request of max_tokens=1; returns its result (TTFT in timings, cached_len)."""
    engine.submit(Extend(uuid.uuid4().hex, "bench", None, ids, SamplingParams(max_tokens=1)))
    return next(m for m in engine.run_until_idle() if isinstance(m, Finished))


def replay_turns(loaded: LoadedModel, cached: Engine, uncached: Engine, peers: list[Any],
                 num_turns: int) -> list[dict[str, Any]]:
    tok = loaded.tokenizer
    rows = []
    context: list[int] = []
    for peer in peers:
        peer.reset_cache()
    for i, turn in enumerate(agent_trajectory(num_turns)):
        delta = tok.encode(turn.text)
        if len(context) + len(delta) > MAX_CONTEXT:
            log(f"stopping at turn {i}: context would exceed {MAX_CONTEXT} tokens")
            break
        prompt = context + delta
        warm = ttft(cached, prompt)
        cold = ttft(uncached, prompt)
        row: dict[str, Any] = {
            "turn": i, "kind": turn.kind, "context_len": len(prompt), "delta_len": len(delta),
            "cached_len": warm.cached_len, "computed_len": warm.computed_len,
            "ttft_cached_s": warm.timings.ttft_s, "ttft_uncached_s": cold.timings.ttft_s}
        for peer in peers:
            row[f"{peer.name}_ttft_s"] = peer.ttft(prompt)
        log(f"turn {i:2d} {turn.kind:10s} context {len(prompt):5d} delta {len(delta):4d}: "
            f"cached {row['ttft_cached_s']:.3f} s, uncached {row['ttft_uncached_s']:.3f} s")
        rows.append(row)
        context = prompt
    return rows


def sweep(loaded: LoadedModel, cached: Engine, uncached: Engine, peers: list[Any],
          repeats: int) -> list[dict[str, Any]]:
    tok = loaded.tokenizer
    corpus = tok.encode("".join(stdlib_source(f) for f in ("difflib.py", "textwrap.py",
                                                           "json/decoder.py", "shlex.py",
                                                           "argparse.py")))
    need = (repeats + 1) * PREFIX_STRIDE + SWEEP_CONTEXTS[-1] + SWEEP_DELTA
    assert len(corpus) >= need, f"sweep corpus has {len(corpus)} tokens, needs {need}"
    rows = []
    # One discarded warm-up run at the smallest context pays every engine's first-call costs.
    runs = [(SWEEP_CONTEXTS[0], 0, False)] + [
        (c, r + 1, True) for c in SWEEP_CONTEXTS for r in range(repeats)]
    samples_by_context: dict[int, dict[str, list[float]]] = {}
    for context_len, r, timed in runs:
        # A fresh prefix and delta each run: no engine needs a cache reset (which costs
        # OpenVINO GenAI a pipeline rebuild), and the delta itself is never cached.
        start = r * PREFIX_STRIDE
        prefix = corpus[start : start + context_len]
        prompt = corpus[start : start + context_len + SWEEP_DELTA]
        ttft(cached, prefix)
        warm = ttft(cached, prompt)
        assert warm.cached_len >= context_len - cached.kv_pool.layout.page_size
        cold = ttft(uncached, prompt)
        peer_ttfts = {}
        for peer in peers:
            peer.ttft(prefix)
            peer_ttfts[peer.name] = peer.ttft(prompt)
        if not timed:
            continue
        samples = samples_by_context.setdefault(context_len, {"cached": [], "uncached": []})
        samples["cached"].append(warm.timings.ttft_s)
        samples["uncached"].append(cold.timings.ttft_s)
        for name, value in peer_ttfts.items():
            samples.setdefault(name, []).append(value)
        if r < repeats:
            continue
        row: dict[str, Any] = {"context_len": context_len, "delta_len": SWEEP_DELTA,
                               "ttft_cached_s": statistics.median(samples["cached"]),
                               "ttft_uncached_s": statistics.median(samples["uncached"]),
                               "samples": samples}
        for peer in peers:
            row[f"{peer.name}_ttft_s"] = statistics.median(samples[peer.name])
        log(f"sweep context {context_len}: cached {row['ttft_cached_s']:.3f} s, "
            f"uncached {row['ttft_uncached_s']:.3f} s")
        rows.append(row)
    return rows


def summarise(result: dict[str, Any], peer_names: list[str]) -> None:
    peer_cols = [f"{p}_ttft_s" for p in peer_names]
    print("\nAgent replay: TTFT per turn (s)")
    print(format_table(
        ["turn", "kind", "context", "delta", "cached", "computed", "ttft cached",
         "ttft uncached", "uncached/cached", *peer_cols, *(f"{p}/cached" for p in peer_names)],
        [[r["turn"], r["kind"], r["context_len"], r["delta_len"], r["cached_len"],
          r["computed_len"], r["ttft_cached_s"], r["ttft_uncached_s"],
          r["ttft_uncached_s"] / r["ttft_cached_s"], *(r[c] for c in peer_cols),
          *(r[c] / r["ttft_cached_s"] for c in peer_cols)] for r in result["turns"]]))
    print(f"\nFixed {SWEEP_DELTA}-token delta sweep: TTFT (s), median of repeats")
    print(format_table(
        ["context", "ttft cached", "ttft uncached", "uncached/cached", *peer_cols,
         *(f"{p}/cached" for p in peer_names)],
        [[r["context_len"], r["ttft_cached_s"], r["ttft_uncached_s"],
          r["ttft_uncached_s"] / r["ttft_cached_s"], *(r[c] for c in peer_cols),
          *(r[c] / r["ttft_cached_s"] for c in peer_cols)] for r in result["sweep"]]))
    s = {r["context_len"]: r for r in result["sweep"]}
    lo, hi = SWEEP_CONTEXTS[0], SWEEP_CONTEXTS[-1]
    print(f"\nprefix-cache hit rate over the replay: {result['hit_rate']:.1%}")
    print(f"uncached/cached TTFT at the deepest turn: {result['ratio_deepest']:.1f}x")
    print(f"uncached/cached TTFT at {hi} context (sweep): "
          f"{s[hi]['ttft_uncached_s'] / s[hi]['ttft_cached_s']:.1f}x")
    print(f"cached TTFT {hi} vs {lo} context: measured "
          f"{s[hi]['ttft_cached_s'] / s[lo]['ttft_cached_s']:.2f}x, arithmetic predicts "
          f"{result['predicted_ratio_hi_lo']:.2f}x")
    print(load_line(result["notes"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=Path("bench-results/agent_replay.json"))
    parser.add_argument("--quick", action="store_true", help="fewer turns and repeats")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--api", choices=["openai", "anthropic"], default=None,
                        help="replay through that compatible route and the native session "
                             "route of a live gateway instead (benchmarks.api_replay)")
    parser.add_argument("--max-tokens", type=int, default=8, help="reply length with --api")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    num_turns = args.turns or (20 if args.quick else 40)
    if args.api is not None:
        from benchmarks.api_replay import run_api_replay

        given = args.json if args.json != parser.get_default("json") else None
        run_api_replay(args.api, num_turns, given, args.max_tokens)
        return
    repeats = args.repeats or (1 if args.quick else 5)
    loaded = load_default_model()
    config = EngineConfig(kv_memory_bytes=2 << 30, max_batch_tokens=1024)
    cached = Engine(loaded, config)
    uncached = Engine(loaded, EngineConfig(kv_memory_bytes=1 << 30, max_batch_tokens=1024,
                                           enable_prefix_cache=False))
    notes = machine_notes(loaded.path)
    notes["precision"] = precision_label(loaded)
    peers: list[Any] = []
    if not args.no_peers:
        from benchmarks.peers.registry import available_peers

        peers = available_peers(loaded.path, THREADS)
    ttft(cached, loaded.tokenizer.encode("warm-up"))  # first-call costs stay out of the timings
    ttft(uncached, loaded.tokenizer.encode("warm-up"))
    turns = replay_turns(loaded, cached, uncached, peers, num_turns)
    stats = cached.stats()
    sweep_rows = sweep(loaded, cached, uncached, peers, repeats)
    finish_notes(notes)
    deepest = turns[-1]
    result = {
        "notes": notes, "page_size": config.page_size,
        "turns": turns, "sweep": sweep_rows,
        "hit_rate": sum(r["cached_len"] for r in turns) / sum(r["context_len"] for r in turns),
        "engine_hit_rate": stats.hit_rate,
        "ratio_deepest": deepest["ttft_uncached_s"] / deepest["ttft_cached_s"],
        "predicted_ratio_hi_lo": predicted_ratio(SWEEP_CONTEXTS[-1], SWEEP_CONTEXTS[0],
                                                 SWEEP_DELTA),
        "peers": [p.name for p in peers],
    }
    summarise(result, result["peers"])
    write_json(args.json, result)
    plot(result, plot_path(args.json))
    for peer in peers:
        peer.close()


if __name__ == "__main__":
    main()
