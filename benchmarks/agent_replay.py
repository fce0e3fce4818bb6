"""Replay an agent trajectory through the engine with the prefix cache on and off, plus peers.

    python -m benchmarks.agent_replay --json bench-results/agent_replay.json [--quick]
    python -m benchmarks.agent_replay --model gemma3-270m --turns 0  (the sweep to 32k)
    python -m benchmarks.agent_replay --api openai|anthropic [--turns N]  (benchmarks.api_replay)

Per turn: context length, delta length, TTFT with the cache (only the delta is computed) and
without it (the whole context is recomputed), and each installed peer's TTFT with its own prefix
caching. Then a fixed-delta sweep: 256 new tokens appended at 1k, 2k, 4k and 7.5k of context
(1k, 4k, 8k, 16k and 32k for a model with a 32k context). Each sweep row gives the extend's FLOPs
and the TTFT they predict at this machine's rates, measured first (`benchmarks.flops`). Prints
the tables, writes JSON and a PNG plot of TTFT against context length.
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
    load_line,
    log,
    machine_notes,
    plot_path,
    precision_label,
    write_json,
)
from benchmarks.flops import Rates, attention_rate, extend_flops
from benchmarks.replay_plot import plot
from benchmarks.workload import agent_trajectory, stdlib_source
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel, default_dtype, load_model
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

MAX_CONTEXT = 7600
SHORT_CONTEXTS = (1000, 2000, 4000, 7500)  # an 8k model
LONG_CONTEXTS = (1000, 4000, 8000, 16000, 32000)  # those that fit a longer model's context
SWEEP_DELTA = 256
PREFIX_STRIDE = 997  # tokens between the starts of successive repeats' prefixes
CORPUS_FILES = ("difflib.py", "textwrap.py", "json/decoder.py", "shlex.py", "argparse.py",
                "typing.py", "inspect.py", "pathlib/_local.py", "dataclasses.py")


def sweep_contexts(context_len: int) -> tuple[int, ...]:
    if context_len <= 8192:
        return SHORT_CONTEXTS
    return tuple(c for c in LONG_CONTEXTS if c + SWEEP_DELTA <= context_len)


def measure_rates(loaded: LoadedModel, uncached: Engine, corpus: list[int]) -> Rates:
    """The machine's rates, measured before the sweep and apart from it: the attention backend
    alone over 8k of keys, and the projections from a context-free 256-token extend (less its
    small attention share at that rate)."""
    config = loaded.model.config
    attn = attention_rate(config, uncached.runner.backend, loaded.model.kv_dtype)
    ids = corpus[:SWEEP_DELTA]
    seconds = min(ttft(uncached, ids).timings.ttft_s for _ in range(3))
    flops = extend_flops(config, 0, SWEEP_DELTA)
    linear = flops.linear / max(seconds - flops.attention / attn, 1e-9)
    log(f"measured rates: projections {linear / 1e9:.0f} GFLOP/s, attention "
        f"{attn / 1e9:.0f} GFLOP/s")
    return Rates(linear, attn)


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


def sweep_corpus(loaded: LoadedModel, contexts: tuple[int, ...], repeats: int) -> list[int]:
    """Python source as tokens, enough for every repeat's shifted prefix at the deepest context."""
    need = (repeats + 1) * PREFIX_STRIDE + contexts[-1] + SWEEP_DELTA
    corpus: list[int] = []
    for name in CORPUS_FILES:
        corpus += loaded.tokenizer.encode(stdlib_source(name))
        if len(corpus) >= need:
            return corpus
    raise SystemExit(f"the sweep corpus has {len(corpus)} tokens, needs {need}: use fewer "
                     "--repeats")


def sweep(cached: Engine, uncached: Engine, peers: list[Any], corpus: list[int],
          contexts: tuple[int, ...], repeats: int, rates: Rates) -> list[dict[str, Any]]:
    config = cached.loaded.model.config
    rows = []
    # One discarded warm-up run at the smallest context pays every engine's first-call costs.
    runs = [(contexts[0], 0, False)] + [(c, r + 1, True) for c in contexts for r in range(repeats)]
    samples_by_context: dict[int, dict[str, list[float]]] = {}
    for context_len, r, timed in runs:
        log(f"sweep context {context_len}, run {r}")
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
        warm_flops = extend_flops(config, context_len, SWEEP_DELTA)
        cold_flops = extend_flops(config, 0, context_len + SWEEP_DELTA)
        row: dict[str, Any] = {"context_len": context_len, "delta_len": SWEEP_DELTA,
                               "ttft_cached_s": statistics.median(samples["cached"]),
                               "ttft_uncached_s": statistics.median(samples["uncached"]),
                               "gflop_cached": warm_flops.total / 1e9,
                               "predicted_cached_s": rates.seconds(warm_flops),
                               "gflop_uncached": cold_flops.total / 1e9,
                               "predicted_uncached_s": rates.seconds(cold_flops),
                               "samples": samples}
        for peer in peers:
            row[f"{peer.name}_ttft_s"] = statistics.median(samples[peer.name])
        log(f"sweep context {context_len}: cached {row['ttft_cached_s']:.3f} s, "
            f"uncached {row['ttft_uncached_s']:.3f} s")
        rows.append(row)
    return rows


def summarise(result: dict[str, Any], peer_names: list[str]) -> None:
    peer_cols = [f"{p}_ttft_s" for p in peer_names]
    if result["turns"]:
        print("\nAgent replay: TTFT per turn (s)")
        print(format_table(
            ["turn", "kind", "context", "delta", "cached", "computed", "ttft cached",
             "ttft uncached", "uncached/cached", *peer_cols,
             *(f"{p}/cached" for p in peer_names)],
            [[r["turn"], r["kind"], r["context_len"], r["delta_len"], r["cached_len"],
              r["computed_len"], r["ttft_cached_s"], r["ttft_uncached_s"],
              r["ttft_uncached_s"] / r["ttft_cached_s"], *(r[c] for c in peer_cols),
              *(r[c] / r["ttft_cached_s"] for c in peer_cols)] for r in result["turns"]]))
        print(f"\nprefix-cache hit rate over the replay: {result['hit_rate']:.1%}")
        print(f"uncached/cached TTFT at the deepest turn: {result['ratio_deepest']:.1f}x")
    print(f"\nFixed {SWEEP_DELTA}-token delta sweep: TTFT (s), median of repeats; GFLOP and "
          "the TTFT they predict at the measured rates")
    print(format_table(
        ["context", "ttft cached", "GFLOP", "predicted", "ttft uncached", "GFLOP",
         "predicted", "uncached/cached", *peer_cols, *(f"{p}/cached" for p in peer_names)],
        [[r["context_len"], r["ttft_cached_s"], r["gflop_cached"], r["predicted_cached_s"],
          r["ttft_uncached_s"], r["gflop_uncached"], r["predicted_uncached_s"],
          r["ttft_uncached_s"] / r["ttft_cached_s"], *(r[c] for c in peer_cols),
          *(r[c] / r["ttft_cached_s"] for c in peer_cols)] for r in result["sweep"]]))
    lo, hi = result["sweep"][0], result["sweep"][-1]
    rates = result["rates_gflop_s"]
    print(f"measured rates: projections {rates['linear']:.0f} GFLOP/s, attention "
          f"{rates['attention']:.0f} GFLOP/s")
    print(f"uncached/cached TTFT at {hi['context_len']} context (sweep): "
          f"{hi['ttft_uncached_s'] / hi['ttft_cached_s']:.1f}x")
    measured = hi["ttft_cached_s"] / lo["ttft_cached_s"]
    predicted = hi["predicted_cached_s"] / lo["predicted_cached_s"]
    print(f"cached TTFT {hi['context_len']} vs {lo['context_len']} context: measured "
          f"{measured:.2f}x, the FLOPs at the measured rates predict {predicted:.2f}x "
          f"({measured / predicted:.2f}x of the prediction; FLOPs alone "
          f"{hi['gflop_cached'] / lo['gflop_cached']:.2f}x)")
    for note in result["peers_skipped"]:
        print(f"peer skipped: {note}")
    print(load_line(result["notes"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None,
                        help="default bench-results/agent_replay[-MODEL].json")
    parser.add_argument("--model", default=None,
                        help="a --model name or path (default: the embedded SmolLM2)")
    parser.add_argument("--quick", action="store_true", help="fewer turns and repeats")
    parser.add_argument("--turns", type=int, default=None, help="0: the sweep only")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--api", choices=["openai", "anthropic"], default=None,
                        help="replay through that compatible route and the native session "
                             "route of a live gateway instead (benchmarks.api_replay)")
    parser.add_argument("--max-tokens", type=int, default=8, help="reply length with --api")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    num_turns = args.turns if args.turns is not None else (20 if args.quick else 40)
    if args.api is not None:
        from benchmarks.api_replay import run_api_replay

        run_api_replay(args.api, num_turns, args.json, args.max_tokens)
        return
    json_path = args.json or Path("bench-results/agent_replay"
                                  f"{'-' + args.model if args.model else ''}.json")
    repeats = args.repeats or (1 if args.quick else 5)
    log(f"loading {args.model or 'the embedded model'}")
    loaded = load_model(args.model, default_dtype("cpu"))
    contexts = sweep_contexts(loaded.model.config.max_position_embeddings)
    corpus = sweep_corpus(loaded, contexts, repeats)
    config = EngineConfig(kv_memory_bytes=2 << 30, max_batch_tokens=1024)
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
    ttft(cached, loaded.tokenizer.encode("warm-up"))  # first-call costs stay out of the timings
    ttft(uncached, loaded.tokenizer.encode("warm-up"))
    rates = measure_rates(loaded, uncached, corpus)
    turns = replay_turns(loaded, cached, uncached, peers, num_turns) if num_turns else []
    stats = cached.stats()
    sweep_rows = sweep(cached, uncached, peers, corpus, contexts, repeats, rates)
    finish_notes(notes)
    result: dict[str, Any] = {
        "notes": notes, "model": loaded.name, "page_size": config.page_size,
        "turns": turns, "sweep": sweep_rows,
        "hit_rate": (sum(r["cached_len"] for r in turns) / sum(r["context_len"] for r in turns)
                     if turns else None),
        "engine_hit_rate": stats.hit_rate,
        "ratio_deepest": (turns[-1]["ttft_uncached_s"] / turns[-1]["ttft_cached_s"]
                          if turns else None),
        "rates_gflop_s": {"linear": rates.linear / 1e9, "attention": rates.attention / 1e9},
        "peers": [p.name for p in peers], "peers_skipped": skipped,
    }
    summarise(result, result["peers"])
    write_json(json_path, result)
    plot(result, plot_path(json_path))
    for peer in peers:
        peer.close()


if __name__ == "__main__":
    main()
