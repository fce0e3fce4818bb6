"""The fixed-delta sweep of benchmarks.agent_replay: SWEEP_DELTA (256) new tokens appended to one
long prefix at each context length, every engine with its own prefix caching.

At each context every engine computes the prefix once. Its first request there is prefix +
delta_0 on a cache that has never seen the prefix (each context's prefix is its own region of
the corpus, starting on a token no other prefix starts with, so no cache can match an earlier
one): for radixgate's cached engine that TTFT is the uncached figure (rule 5: cold is a cache
that never saw the prefix), measured once per context because it is long; a peer's is its own
cold TTFT. Then one discarded warm run (delta_1) and `repeats` timed ones (delta_2, ...): fresh
256-token deltas after the same prefix, which each engine takes from its cache (radixgate's
radix tree; llama.cpp keeps the common prefix of its last sequence; OpenVINO GenAI its KV
blocks by content). Reuse is checked on every timed run: radixgate's `cached_len`, llama.cpp's
`last_cached_len`; OpenVINO reports nothing, so its reuse is inferred from the TTFT (a
recompute takes at least its cold TTFT; a run under half of it reused the prefix).
"""

from __future__ import annotations

import statistics
import uuid
from typing import Any

from benchmarks.common import log, median_of
from benchmarks.flops import Rates, extend_flops
from benchmarks.workload import stdlib_source
from engine.config import ModelConfig
from engine.engine import Engine
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

SWEEP_DELTA = 256
INFERRED_REUSE = 0.5  # a warm TTFT under this fraction of the cold one reused the prefix
CORPUS_FILES = ("difflib.py", "textwrap.py", "json/decoder.py", "shlex.py", "argparse.py",
                "typing.py", "inspect.py", "pathlib.py", "pathlib/_local.py", "dataclasses.py",
                "collections/__init__.py", "tarfile.py", "zipfile/__init__.py", "zipfile.py")


def sweep_corpus(loaded: LoadedModel, contexts: tuple[int, ...], repeats: int
                 ) -> tuple[dict[int, list[int]], list[list[int]], list[int]]:
    """(prefix per context, deltas, probe): Python source as tokens, each prefix its own region
    starting on a first token no other prefix has, then repeats + 2 deltas, then a probe of
    SWEEP_DELTA tokens for the rates (starting on a token no prefix starts with)."""
    need = sum(contexts) + len(contexts) * 64 + (repeats + 4) * SWEEP_DELTA
    corpus: list[int] = []
    for name in CORPUS_FILES:
        try:
            corpus += loaded.tokenizer.encode(stdlib_source(name))
        except OSError:
            continue  # a file this Python version does not have
        if len(corpus) >= need:
            break
    else:
        raise SystemExit(f"the sweep corpus has {len(corpus)} tokens, needs {need}: use fewer "
                         "--repeats")
    start = 0

    def take(length: int, firsts: set[int]) -> list[int]:
        """The next `length` tokens from a start whose token is not in `firsts`."""
        nonlocal start
        while corpus[start] in firsts:
            start += 1
        firsts.add(corpus[start])
        start += length
        return corpus[start - length : start]

    prefix_firsts: set[int] = set()
    prefixes = {context: take(context, prefix_firsts) for context in contexts}
    # Deltas start on different tokens too, so llama.cpp's common prefix with the previous
    # delta is the prefix itself, never a few tokens more.
    delta_firsts: set[int] = set()
    deltas = [take(SWEEP_DELTA, delta_firsts) for _ in range(repeats + 2)]
    return prefixes, deltas, take(SWEEP_DELTA, set(prefix_firsts))


def estimate_s(config: ModelConfig, rates: Rates, contexts: tuple[int, ...], repeats: int,
               engines: float, turn_lens: list[int]) -> dict[str, float]:
    """Expected seconds at radixgate's measured rates, times `engines` (1 plus each peer's
    cold-TTFT ratio to radixgate's on the same 256 tokens): the sweep (per context, one cold
    prefix + delta and repeats + 1 warm deltas per engine) and the turns (the delta per turn
    per engine, and radixgate's uncached engine every whole context)."""
    sweep = sum(engines * (rates.seconds(extend_flops(config, 0, c + SWEEP_DELTA))
                           + (repeats + 1) * rates.seconds(extend_flops(config, c, SWEEP_DELTA)))
                for c in contexts)
    turns, context = 0.0, 0
    for delta in turn_lens:
        turns += engines * rates.seconds(extend_flops(config, context, delta))
        context += delta
        turns += rates.seconds(extend_flops(config, 0, context))
    return {"sweep_s": sweep, "turns_s": turns, "total_s": sweep + turns, "engines": engines}


def ttft(engine: Engine, ids: list[int]) -> Finished:
    """One request of max_tokens=1; returns its result (TTFT in timings, cached_len)."""
    engine.submit(Extend(uuid.uuid4().hex, "bench", None, ids, SamplingParams(max_tokens=1)))
    return next(m for m in engine.run_until_idle() if isinstance(m, Finished))


def sweep(cached: Engine, peers: list[Any], prefixes: dict[int, list[int]],
          deltas: list[list[int]], repeats: int, rates: Rates) -> list[dict[str, Any]]:
    config = cached.loaded.model.config
    page = cached.kv_pool.layout.page_size
    rows = []
    for context, prefix in prefixes.items():
        log(f"sweep context {context}: cold prefix + delta on every engine")
        cold = ttft(cached, prefix + deltas[0])
        peer_cold = {p.name: p.ttft(prefix + deltas[0]) for p in peers}
        peer_cold_cached = {p.name: p.last_cached_len for p in peers}
        samples: dict[str, list[float]] = {"cached": []}
        reuse: dict[str, list[int | None]] = {"radixgate": []}
        for p in peers:
            samples[p.name], reuse[p.name] = [], []
        for r in range(1, repeats + 2):
            timed = r > 1  # delta_1 is the discarded warm-up
            log(f"sweep context {context}: delta {r} ({'timed' if timed else 'warm-up'})")
            warm = ttft(cached, prefix + deltas[r])
            peer_warm = {p.name: (p.ttft(prefix + deltas[r]), p.last_cached_len) for p in peers}
            if not timed:
                continue
            samples["cached"].append(warm.timings.ttft_s)
            reuse["radixgate"].append(warm.cached_len)
            for name, (seconds, cached_len) in peer_warm.items():
                samples[name].append(seconds)
                reuse[name].append(cached_len)
        warm_flops = extend_flops(config, context, SWEEP_DELTA)
        cold_flops = extend_flops(config, 0, context + SWEEP_DELTA)
        row: dict[str, Any] = {
            "context_len": context, "delta_len": SWEEP_DELTA,
            "ttft_cached_s": statistics.median(samples["cached"]),
            "ttft_cached": median_of(samples["cached"]),
            "ttft_uncached_s": cold.timings.ttft_s, "uncached_runs": 1,
            "uncached_cached_len": cold.cached_len,
            "gflop_cached": warm_flops.total / 1e9,
            "predicted_cached_s": rates.seconds(warm_flops),
            "gflop_uncached": cold_flops.total / 1e9,
            "predicted_uncached_s": rates.seconds(cold_flops),
            "samples": samples, "reused_len": reuse,
            "reused": {"radixgate": all(c is not None and c >= context - page
                                        for c in reuse["radixgate"])},
        }
        for p in peers:
            row[f"{p.name}_ttft_s"] = statistics.median(samples[p.name])
            row[f"{p.name}_ttft"] = median_of(samples[p.name])
            row[f"{p.name}_cold_ttft_s"] = peer_cold[p.name]
            row[f"{p.name}_cold_cached_len"] = peer_cold_cached[p.name]
            if all(c is not None for c in reuse[p.name]):
                row["reused"][p.name] = all(c is not None and c >= context
                                            for c in reuse[p.name])
                row.setdefault("reuse_how", {})[p.name] = "cached length it reports"
            else:
                row["reused"][p.name] = all(s < INFERRED_REUSE * peer_cold[p.name]
                                            for s in samples[p.name])
                row.setdefault("reuse_how", {})[p.name] = (
                    f"inferred: every warm TTFT < {INFERRED_REUSE:g} x its cold TTFT")
        log(f"sweep context {context}: cached {row['ttft_cached_s']:.3f} s, uncached "
            f"{row['ttft_uncached_s']:.3f} s" + "".join(
                f", {p.name} {row[f'{p.name}_ttft_s']:.3f} s" for p in peers))
        rows.append(row)
    return rows
