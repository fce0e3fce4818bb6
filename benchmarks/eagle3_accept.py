"""EAGLE-3 head acceptance and decode speed against `--spec none`, greedy, batch 1, real model.

    python -m benchmarks.eagle3_accept --head engine/spec/heads/smollm2-135m-eagle3 \
        [--draft-lens 2,4] [--repeats 1] [--json bench-results/eagle3_accept.json]

Prompts: new prose and questions (none of them is a `train-draft` template) and the
`spec_decode` workloads (an edit re-emitting a file, a tool call after a history, a story).
For each prompt and draft length: whether the output equals `--spec none`'s token for token,
drafted and accepted tokens, the acceptance rate (accepted / drafted), the mean tokens per
verify step (decoded tokens / target steps, 1.0 means drafting never helped) and the decode
tok/s ratio against `--spec none` run back to back. The drafting gate is off
(`draft_backoff` 0) so every step drafts and the rates are the head's own.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    THREADS,
    format_table,
    load_default_model,
    log,
    machine_notes,
    precision_label,
    write_json,
)
from benchmarks.spec_decode import _chatml, decode_run, decode_tok_s, workloads
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel

NEW_PROMPTS = [
    "Write a short essay about why people enjoy walking in forests.",
    "Explain how a refrigerator keeps food cold.",
    "Tell me a bedtime story about a fox who learns to share.",
    "What are the benefits of learning a second language?",
    "Describe a busy market in the morning.",
    "How do airplanes stay in the air?",
]


def prompts() -> dict[str, tuple[str, int]]:
    """name -> (ChatML text, max new tokens)."""
    out = {f"new{i}": (_chatml([("user", text)]), 128) for i, text in enumerate(NEW_PROMPTS)}
    out.update(workloads())
    return out


def measure(loaded: LoadedModel, head: Path, draft_lens: list[int],
            repeats: int) -> dict[str, Any]:
    def engine(spec: str, draft_len: int) -> Engine:
        return Engine(loaded, EngineConfig(kv_memory_bytes=512 << 20, spec=spec,
                                           max_draft_len=draft_len, draft_backoff=0,
                                           enable_prefix_cache=False))

    plain = engine("none", 1)
    spec = {k: engine(f"eagle3:{head}", k) for k in draft_lens}
    rows: dict[str, Any] = {}
    for name, (text, max_tokens) in prompts().items():
        ids = loaded.tokenizer.encode(text)
        for k, eng in spec.items():
            ratios, identical = [], True
            for r in range(repeats):
                base = decode_run(plain, ids, max_tokens, f"{name}-{k}-{r}")
                done = decode_run(eng, ids, max_tokens, f"{name}-{k}-{r}")
                identical &= done.output_token_ids == base.output_token_ids
                ratios.append(decode_tok_s(done) / max(decode_tok_s(base), 1e-9))
            decoded = done.output_len - 1 + (done.stop_token_id is not None)
            steps = decoded - done.num_accepted
            rows[f"{name}/k{k}"] = {
                "prompt": name, "draft_len": k, "output_len": done.output_len,
                "identical": identical, "drafted": done.num_drafted,
                "accepted": done.num_accepted,
                "acceptance": done.num_accepted / max(done.num_drafted, 1),
                "tokens_per_step": decoded / max(steps, 1),
                "speed_ratio": statistics.median(ratios)}
            log(f"{name} k={k}: {rows[f'{name}/k{k}']}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", type=Path, required=True)
    parser.add_argument("--draft-lens", default="2,4")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("bench-results/eagle3_accept.json"))
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    loaded = load_default_model()
    notes = machine_notes(loaded.path)
    notes["precision"] = precision_label(loaded)
    draft_lens = [int(k) for k in args.draft_lens.split(",")]
    rows = measure(loaded, args.head, draft_lens, args.repeats)
    headers = ["prompt", "k", "output", "identical", "drafted", "accepted", "acceptance",
               "tokens/step", "speed ratio"]
    table = [[r["prompt"], r["draft_len"], r["output_len"], r["identical"], r["drafted"],
              r["accepted"], r["acceptance"], r["tokens_per_step"], r["speed_ratio"]]
             for r in rows.values()]
    for k in draft_lens:
        mine = [r for r in rows.values() if r["draft_len"] == k]
        table.append(["ALL", k, sum(r["output_len"] for r in mine),
                      all(r["identical"] for r in mine), sum(r["drafted"] for r in mine),
                      sum(r["accepted"] for r in mine),
                      sum(r["accepted"] for r in mine) / max(sum(r["drafted"] for r in mine), 1),
                      statistics.mean(r["tokens_per_step"] for r in mine),
                      statistics.median(r["speed_ratio"] for r in mine)])
    print(format_table(headers, table))
    write_json(args.json, {"notes": notes, "head": str(args.head), "rows": rows})


if __name__ == "__main__":
    main()
