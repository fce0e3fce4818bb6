"""Replay an agent trajectory through the engine with the prefix cache on and off, plus peers.

    python -m benchmarks.agent_replay --json bench-results/agent_replay.json [--quick]
    python -m benchmarks.agent_replay --model qwen2.5-coder-1.5b --turns 0  (the sweep to 32k)
    python -m benchmarks.agent_replay --api openai|anthropic [--turns N]  (benchmarks.api_replay)

Per turn: context length, delta length, TTFT with the cache (only the delta is computed) and
without it (the whole context is recomputed), and each installed peer's TTFT with its own prefix
caching. Then a fixed-delta sweep (benchmarks.replay_sweep): 256 new tokens appended at 1k, 2k,
4k and 7.5k of context (2k, 8k, 16k and 32k for a model with a 32k context); each engine
computes each prefix once, then `--repeats` fresh deltas after it (median, min, max), and
radixgate's uncached TTFT is its one cold request per context. Each sweep row gives the
extend's FLOPs and the TTFT they predict at this machine's rates, measured first
(`benchmarks.flops`), which also give the expected wall time printed before the run. Prints the
tables and the issue's targets (PASS/FAIL, with the CPU class), writes JSON and a PNG plot of
TTFT against context length.
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
    log,
    machine_notes,
    model_tag,
    plot_path,
    precision_label,
    write_json,
)
from benchmarks.flops import Rates, attention_rate, extend_flops
from benchmarks.replay_plot import plot
from benchmarks.replay_report import summarise, sweep_targets
from benchmarks.replay_sweep import SWEEP_DELTA, estimate_s, sweep, sweep_corpus, ttft
from benchmarks.workload import agent_trajectory
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel, default_dtype, load_model

MAX_CONTEXT = 7600
SHORT_CONTEXTS = (1000, 2000, 4000, 7500)  # an 8k model
LONG_CONTEXTS = (2000, 8000, 16000, 32000)  # those that fit a longer model's context
QUICK_CONTEXTS = (1000, 2000)  # --quick: a smoke check of the harness on any model
QUICK_TURNS = 8


def sweep_contexts(context_len: int, quick: bool = False) -> tuple[int, ...]:
    """The sweep's prefix lengths for a model of `context_len` positions (module docstring)."""
    if quick:
        return QUICK_CONTEXTS
    if context_len <= 8192:
        return SHORT_CONTEXTS
    return tuple(c for c in LONG_CONTEXTS if c + SWEEP_DELTA < context_len)


def measure_rates(loaded: LoadedModel, uncached: Engine, ids: list[int]) -> tuple[Rates, float]:
    """The machine's rates, measured before the sweep and apart from it: the attention backend
    alone over 8k of keys, and the projections from a context-free 256-token extend (less its
    small attention share at that rate), with that extend's TTFT."""
    config = loaded.model.config
    attn = attention_rate(config, uncached.runner.backend, loaded.model.kv_dtype)
    seconds = min(ttft(uncached, ids[:SWEEP_DELTA]).timings.ttft_s for _ in range(3))
    flops = extend_flops(config, 0, SWEEP_DELTA)
    linear = flops.linear / max(seconds - flops.attention / attn, 1e-9)
    log(f"measured rates: projections {linear / 1e9:.0f} GFLOP/s, attention "
        f"{attn / 1e9:.0f} GFLOP/s")
    return Rates(linear, attn), seconds


def turn_deltas(loaded: LoadedModel, num_turns: int) -> list[list[int]]:
    """The trajectory's turns as token ids, up to MAX_CONTEXT tokens in all."""
    out: list[list[int]] = []
    total = 0
    for i, turn in enumerate(agent_trajectory(num_turns)):
        delta = loaded.tokenizer.encode(turn.text)
        if total + len(delta) > MAX_CONTEXT:
            log(f"stopping at turn {i}: context would exceed {MAX_CONTEXT} tokens")
            break
        out.append(delta)
        total += len(delta)
    return out


def replay_turns(cached: Engine, uncached: Engine, peers: list[Any],
                 deltas: list[list[int]]) -> list[dict[str, Any]]:
    rows = []
    context: list[int] = []
    for peer in peers:
        peer.reset_cache()
    kinds = [t.kind for t in agent_trajectory(len(deltas))]
    for i, delta in enumerate(deltas):
        prompt = context + delta
        warm = ttft(cached, prompt)
        cold = ttft(uncached, prompt)
        row: dict[str, Any] = {
            "turn": i, "kind": kinds[i], "context_len": len(prompt), "delta_len": len(delta),
            "cached_len": warm.cached_len, "computed_len": warm.computed_len,
            "ttft_cached_s": warm.timings.ttft_s, "ttft_uncached_s": cold.timings.ttft_s}
        for peer in peers:
            row[f"{peer.name}_ttft_s"] = peer.ttft(prompt)
        log(f"turn {i:2d} {kinds[i]:10s} context {len(prompt):5d} delta {len(delta):4d}: "
            f"cached {row['ttft_cached_s']:.3f} s, uncached {row['ttft_uncached_s']:.3f} s")
        rows.append(row)
        context = prompt
    return rows


def kv_bytes_for(loaded: LoadedModel, tokens: int) -> int:
    """A KV pool holding `tokens` tokens with a margin, and never under 2 GiB."""
    config = loaded.model.config
    itemsize = torch.empty((), dtype=loaded.model.kv_dtype).element_size()
    return max(2 << 30, int(2 * config.num_layers * config.kv_size * itemsize * tokens * 1.2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None,
                        help="default bench-results/agent_replay[-MODEL].json")
    parser.add_argument("--model", default=None,
                        help="a --model name or path (default: the embedded SmolLM2)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke check: {QUICK_TURNS} turns, 1 repeat, sweep contexts "
                             f"{'/'.join(map(str, QUICK_CONTEXTS))}")
    parser.add_argument("--turns", type=int, default=None, help="0: the sweep only")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--contexts", default=None,
                        help="comma-separated sweep contexts (default: 1k-7.5k for an 8k "
                             "model, 2k/8k/16k/32k for a 32k one)")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--api", choices=["openai", "anthropic"], default=None,
                        help="replay through that compatible route and the native session "
                             "route of a live gateway instead (benchmarks.api_replay)")
    parser.add_argument("--max-tokens", type=int, default=8, help="reply length with --api")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    num_turns = args.turns if args.turns is not None else (QUICK_TURNS if args.quick else 40)
    if args.api is not None:
        from benchmarks.api_replay import run_api_replay

        run_api_replay(args.api, num_turns, args.json, args.max_tokens)
        return
    json_path = args.json or Path("bench-results/agent_replay"
                                  f"{'-' + model_tag(args.model) if args.model else ''}.json")
    repeats = args.repeats or (1 if args.quick else 5)
    log(f"loading {args.model or 'the embedded model'}")
    loaded = load_model(args.model or "smollm2-135m", default_dtype("cpu"))
    contexts = (tuple(int(c) for c in args.contexts.split(",")) if args.contexts
                else sweep_contexts(loaded.model.config.max_position_embeddings, args.quick))
    prefixes, deltas, probe = sweep_corpus(loaded, contexts, repeats)
    config = EngineConfig(kv_memory_bytes=kv_bytes_for(
        loaded, contexts[-1] + (repeats + 2) * (SWEEP_DELTA + 16) + 2048), max_batch_tokens=1024)
    cached = Engine(loaded, config)
    uncached = Engine(loaded, EngineConfig(kv_memory_bytes=1 << 30, max_batch_tokens=1024,
                                           enable_prefix_cache=False))
    notes = machine_notes(loaded.path)
    notes["precision"] = precision_label(loaded)
    peers: list[Any] = []
    skipped: list[str] = []
    if not args.no_peers:
        from benchmarks.peers.registry import available_peers

        peers = available_peers(loaded.path, THREADS, context_len=cached.context_len,
                                skipped=skipped)
    warm_ids = loaded.tokenizer.encode("warm-up")  # first-call costs stay out of the timings
    ttft(cached, warm_ids)
    ttft(uncached, warm_ids)
    for peer in peers:
        peer.ttft(warm_ids)
    rates, probe_s = measure_rates(loaded, uncached, probe)
    # Each peer's cold TTFT on the same 256 tokens scales the estimate (its prefill is not
    # radixgate's); the probe starts on a token no sweep prefix starts with.
    peer_scale = {p.name: p.ttft(probe) / probe_s for p in peers}
    turn_ids = turn_deltas(loaded, num_turns) if num_turns else []
    estimate = estimate_s(loaded.model.config, rates, contexts, repeats,
                          1 + sum(peer_scale.values()), [len(d) for d in turn_ids])
    print(f"expected wall time from here ~{estimate['total_s'] / 60:.1f} min (turns "
          f"{estimate['turns_s'] / 60:.1f}, sweep {estimate['sweep_s'] / 60:.1f}): radixgate's "
          f"measured rates, each peer scaled by its 256-token cold TTFT over radixgate's "
          f"({', '.join(f'{n} {x:.2f}x' for n, x in peer_scale.items()) or 'no peers'})",
          flush=True)
    started = time.perf_counter()
    turns = replay_turns(cached, uncached, peers, turn_ids) if turn_ids else []
    stats = cached.stats()
    sweep_rows = sweep(cached, peers, prefixes, deltas, repeats, rates)
    finish_notes(notes)
    result: dict[str, Any] = {
        "notes": notes, "model": loaded.name, "page_size": config.page_size,
        "repeats": repeats, "turns": turns, "sweep": sweep_rows,
        "hit_rate": (sum(r["cached_len"] for r in turns) / sum(r["context_len"] for r in turns)
                     if turns else None),
        "engine_hit_rate": stats.hit_rate,
        "ratio_deepest": (turns[-1]["ttft_uncached_s"] / turns[-1]["ttft_cached_s"]
                          if turns else None),
        "rates_gflop_s": {"linear": rates.linear / 1e9, "attention": rates.attention / 1e9},
        "estimate": estimate, "peer_probe_scale": peer_scale,
        "wall_s": time.perf_counter() - started,
        "peers": [p.name for p in peers], "peers_skipped": skipped,
    }
    targets = sweep_targets(result)
    result["targets"] = [t.as_json() for t in targets]
    summarise(result, result["peers"], targets)
    write_json(json_path, result)
    plot(result, plot_path(json_path))
    for peer in peers:
        peer.close()


if __name__ == "__main__":
    main()
