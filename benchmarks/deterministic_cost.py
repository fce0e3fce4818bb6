"""What `--deterministic` costs: prefill and decode with it and without, side by side in one
process, runs interleaved, on the embedded model in the machine's default dtype.

    python -m benchmarks.deterministic_cost [--repeats 3] [--json PATH]

Prefill: TTFT of a fresh prompt of 512 and 2048 tokens (nothing cached). Decode: tokens/s of 64
greedy tokens after a 256-token prompt. Cached turn: TTFT of a 256-token delta on a cached
2048-token prefix (the agent case). Prints the table with the ratios, writes JSON.
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
    precision_label,
    write_json,
)
from benchmarks.workload import stdlib_source
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel, default_dtype, load_model
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams


def _run(engine: Engine, ids: list[int], max_tokens: int) -> Finished:
    rid = uuid.uuid4().hex
    engine.submit(Extend(rid, "bench", None, ids, SamplingParams(max_tokens=max_tokens,
                                                                 ignore_eos=True)))
    return next(m for m in engine.run_until_idle() if isinstance(m, Finished))


def _measure(engine: Engine, corpus: list[int], offset: int) -> dict[str, float]:
    """One round of every figure, on prompts starting at `offset` (never cached before)."""
    out: dict[str, float] = {}
    for n in (512, 2048):
        out[f"prefill_{n}_tok_s"] = n / _run(engine, corpus[offset : offset + n], 1).timings.ttft_s
        offset += n
    done = _run(engine, corpus[offset : offset + 256], 64)
    out["decode_tok_s"] = (done.output_len - 1) / done.timings.decode_s
    offset += 256
    prefix = corpus[offset : offset + 2048]
    _run(engine, prefix, 1)
    out["cached_delta_s"] = _run(engine, corpus[offset : offset + 2304], 1).timings.ttft_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench-results/deterministic.json"))
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    loaded: LoadedModel = load_model(None, default_dtype("cpu"))
    corpus = loaded.tokenizer.encode("".join(stdlib_source(f) for f in (
        "argparse.py", "difflib.py", "typing.py", "inspect.py")))
    notes = machine_notes(loaded.path)
    notes["precision"] = precision_label(loaded)
    engines = {mode: Engine(loaded, EngineConfig(deterministic=mode == "deterministic",
                                                 spec="none", kv_memory_bytes=1 << 30))
               for mode in ("default", "deterministic")}
    for engine in engines.values():
        _run(engine, corpus[:64], 2)  # first-call costs stay out
    samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in engines}
    for r in range(args.repeats):
        for mode, engine in engines.items():  # interleaved: drift hits both alike
            samples[mode].append(_measure(engine, corpus, 128 + r * 5500))
            log(f"round {r + 1}: {mode} {samples[mode][-1]}")
    finish_notes(notes)
    keys = list(samples["default"][0])
    medians = {mode: {k: statistics.median(s[k] for s in rows) for k in keys}
               for mode, rows in samples.items()}
    table = format_table(
        ["figure", "default", "deterministic", "deterministic / default"],
        [[k, medians["default"][k], medians["deterministic"][k],
          medians["deterministic"][k] / medians["default"][k]] for k in keys])
    print(f"--deterministic against the default mode ({notes['precision']}), median of "
          f"{args.repeats}\n{table}\n{load_line(notes)}")
    result: dict[str, Any] = {"notes": notes, "medians": medians, "samples": samples}
    write_json(args.json, result)


if __name__ == "__main__":
    main()
