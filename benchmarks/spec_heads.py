"""Drafters side by side on the embedded GGUF: plain decoding, the trajectory suffix drafter, an
EAGLE-3 head as a chain and as a tree, and the head with the suffix drafter, at batch 1 and 8.

    python -m benchmarks.spec_heads --head HEAD_DIR [--repeats 3] [--json FILE]

Workloads (greedy): `spec_decode`'s edit (a file re-emitted), tool_call (a call after a
history) and prose (a story), and held-out prose: new questions that are none of `train-draft`'s
templates. Batch 8 runs eight requests at once, each in a namespace and session of its own (no
drafter copies another's output); prose rows take eight different held-out prompts.

Per workload, batch and mode: decode tokens/s over the batch (the tokens emitted once every
request has its first, over the time from then to the last), its ratio to plain decoding run
back to back, the mean accepted length (tokens per verify step), whether every output equals
plain decoding's (in the default mode a prompt's chunking follows the step's token budget,
which drafts share, so a prompt's KV may differ in its last bits; `--deterministic` is exact),
and acceptance by depth (the share of verifications that accepted at least d
drafts); at batch 1, OpenVINO GenAI's prompt-lookup decoding on the same GGUF and threads, as a
ratio to our plain decoding run just before it, where it is installed. Separately: the head's
cost per draft step against the target's per decode step.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    THREADS,
    finish_notes,
    format_table,
    load_default_model,
    log,
    machine_notes,
    plot_path,
    precision_label,
    write_json,
)
from benchmarks.eagle3_accept import NEW_PROMPTS
from benchmarks.spec_decode import _chatml, workloads
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished, TokenChunk
from engine.sampling_params import SamplingParams

HELD_OUT = [*NEW_PROMPTS, "Why do leaves change colour in autumn?",
            "Describe what a lighthouse keeper does at night."]
TREE = {"draft_topk": 3, "draft_steps": 4, "max_draft_len": 8}


def modes(head: Path) -> dict[str, dict[str, Any]]:
    return {"plain": {"spec": "none"}, "suffix": {"spec": "suffix"},
            "eagle3 chain": {"spec": f"eagle3:{head}", "max_draft_len": 3},
            "eagle3 tree": {"spec": f"eagle3:{head}", **TREE},
            "eagle3+suffix tree": {"spec": f"eagle3+suffix:{head}", **TREE}}


def batch_prompts(loaded: LoadedModel, name: str, text: str, batch: int) -> list[list[int]]:
    if name == "held_out":
        return [loaded.tokenizer.encode(_chatml([("user", HELD_OUT[i % len(HELD_OUT)])]))
                for i in range(batch)]
    return [loaded.tokenizer.encode(text)] * batch


def run_batch(engine: Engine, prompts: list[list[int]], max_tokens: int
              ) -> tuple[list[list[int]], float]:
    """Outputs and decode tokens/s over the batch: the tokens emitted once every request has
    its first one (all prompts prefilled), over the time from then to the last token, so
    prefill chunks of later requests do not count as decode time."""
    run = uuid.uuid4().hex[:8]
    for i, ids in enumerate(prompts):
        engine.submit(Extend(f"{run}-{i}", f"{run}-{i}", None, ids,
                             SamplingParams(max_tokens=max_tokens), session_id=f"{run}-{i}"))
    started: set[str] = set()
    emitted: list[tuple[float, int]] = []  # (time, tokens) once every request decodes
    window_start = 0.0
    done: dict[str, Finished] = {}
    while engine.has_work:
        messages = engine.step()
        now = time.perf_counter()
        for m in messages:
            if isinstance(m, TokenChunk):
                if len(started) == len(prompts):
                    emitted.append((now, len(m.token_ids)))
                started.add(m.request_id)
            elif isinstance(m, Finished):
                done[m.request_id] = m
        if len(started) == len(prompts) and not window_start:
            window_start = now
    outputs = [done[f"{run}-{i}"].output_token_ids for i in range(len(prompts))]
    if not emitted:
        return outputs, 0.0
    elapsed = emitted[-1][0] - window_start
    return outputs, sum(n for _, n in emitted) / elapsed if elapsed > 0 else 0.0


def openvino_pld(loaded: LoadedModel) -> Any:
    """OpenVINO GenAI's prompt-lookup decoding on the same GGUF, or None where it is not
    installed (pip install '.[bench]')."""
    try:
        from benchmarks.peers.openvino_peer import OpenVINOPeer

        return OpenVINOPeer(loaded.path, THREADS, prompt_lookup=True)
    except ImportError:
        log("openvino-genai is not installed: no peer column (pip install '.[bench]')")
        return None


def measure(loaded: LoadedModel, head: Path, repeats: int, batches: list[int]
            ) -> dict[str, Any]:
    engines = {name: Engine(loaded, EngineConfig(kv_memory_bytes=512 << 20,
                                                 enable_prefix_cache=False, **config))
               for name, config in modes(head).items()}
    peer = openvino_pld(loaded)
    texts = dict(workloads())
    texts["held_out"] = ("", 128)
    rows: dict[str, Any] = {}
    for batch in batches:
        for name, (text, max_tokens) in texts.items():
            prompts = batch_prompts(loaded, name, text, batch)
            speeds: dict[str, list[float]] = {m: [] for m in engines}
            identical = dict.fromkeys(engines, True)
            before = {m: _counts(e) for m, e in engines.items()}
            pld: list[float] = []
            for _ in range(repeats):
                plain, plain_speed = run_batch(engines["plain"], prompts, max_tokens)
                speeds["plain"].append(plain_speed)
                if peer is not None and batch == 1:  # its generate() serves one prompt
                    pld.append(peer.decode_tok_s(prompts[0], len(plain[0])) / plain_speed)
                for mode, engine in engines.items():
                    if mode == "plain":
                        continue
                    outputs, speed = run_batch(engine, prompts, max_tokens)
                    identical[mode] &= outputs == plain
                    speeds[mode].append(speed)
            for mode, engine in engines.items():
                drafted, accepted, lens = _delta(before[mode], _counts(engine))
                ratios = [s / p for s, p in zip(speeds[mode], speeds["plain"], strict=True) if p]
                verifies = sum(lens.values())
                rows[f"{name}/b{batch}/{mode}"] = {
                    "workload": name, "batch": batch, "mode": mode,
                    "tok_s": statistics.median(speeds[mode]),
                    "ratio": statistics.median(ratios) if ratios else 0.0,
                    "identical": identical[mode], "drafted": drafted, "accepted": accepted,
                    "mean_accepted_len": 1 + accepted / verifies if verifies else 1.0,
                    "accept_by_depth": [sum(n for k, n in lens.items() if k >= d) / verifies
                                        for d in range(1, 5)] if verifies else [],
                    "openvino_pld_ratio": statistics.median(pld) if pld else None}
                log(f"{name} batch {batch} {mode}: {rows[f'{name}/b{batch}/{mode}']}")
    return rows


def _counts(engine: Engine) -> tuple[int, int, dict[int, int]]:
    spec = engine.speculator
    if spec is None:
        return 0, 0, {}
    return spec.num_drafted, spec.num_accepted, dict(spec.accepted_lens)


def _delta(before: tuple[int, int, dict[int, int]], after: tuple[int, int, dict[int, int]]
           ) -> tuple[int, int, dict[int, int]]:
    lens = {k: n - before[2].get(k, 0) for k, n in after[2].items()}
    return after[0] - before[0], after[1] - before[1], {k: n for k, n in lens.items() if n}


def head_cost(loaded: LoadedModel, head: Path) -> dict[str, float]:
    """ms per head draft step (batch 1, 500 positions of context) and per target decode step."""
    engine = Engine(loaded, EngineConfig(spec=f"eagle3:{head}", max_draft_len=4,
                                         draft_backoff=0, enable_prefix_cache=False))
    plain = Engine(loaded, EngineConfig(spec="none", enable_prefix_cache=False))
    ids = loaded.tokenizer.encode(_chatml([("user", HELD_OUT[0] * 12)]))[:500]
    assert engine.speculator is not None
    drafter = engine.speculator.drafter
    spent = [0.0]
    propose = drafter.propose

    def timed(requests: Any, max_lens: Any) -> Any:
        t = time.perf_counter()
        out = propose(requests, max_lens)
        spent[0] += time.perf_counter() - t
        return out

    drafter.propose = timed  # type: ignore[method-assign]
    engine.submit(Extend("h", "h", None, ids, SamplingParams(max_tokens=64, ignore_eos=True)))
    done = next(m for m in engine.run_until_idle() if isinstance(m, Finished))
    plain.submit(Extend("p", "p", None, ids, SamplingParams(max_tokens=64, ignore_eos=True)))
    base = next(m for m in plain.run_until_idle() if isinstance(m, Finished))
    steps = done.output_len - 1 - done.num_accepted
    return {"head_ms_per_draft_token": spent[0] * 1e3 / max(done.num_drafted, 1),
            "target_ms_per_decode_step": base.timings.decode_s * 1e3 / max(base.output_len - 1, 1),
            "verify_steps": float(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--json", type=Path, default=Path("bench-results/spec_heads.json"))
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    loaded = load_default_model()
    notes = machine_notes(loaded.path)
    notes["precision"] = precision_label(loaded)
    rows = measure(loaded, args.head, args.repeats, [int(b) for b in args.batches.split(",")])
    cost = head_cost(loaded, args.head)
    finish_notes(notes)
    headers = ["workload", "batch", "mode", "tok/s", "x plain", "mean accepted", "identical",
               "accept >=1", ">=2", ">=3", ">=4", "openvino pld x plain"]
    table = [[r["workload"], r["batch"], r["mode"], r["tok_s"], r["ratio"],
              r["mean_accepted_len"], r["identical"], *(r["accept_by_depth"] or [None] * 4),
              r["openvino_pld_ratio"] if r["mode"] == "plain" else None]
             for r in rows.values()]
    print(f"\nDrafters, greedy, {notes['precision']}, medians of {args.repeats}")
    print(format_table(headers, table))
    print(f"head {cost['head_ms_per_draft_token']:.2f} ms per draft token, target "
          f"{cost['target_ms_per_decode_step']:.2f} ms per decode step")
    write_json(args.json, {"notes": notes, "head": str(args.head), "rows": rows,
                           "head_cost": cost})
    plot(rows, plot_path(args.json))
    log(f"wrote {args.json} and {plot_path(args.json)}")


def plot(rows: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["workload"], r["batch"]) for r in rows.values()})
    names = list(dict.fromkeys(r["mode"] for r in rows.values()))
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(names)
    for j, mode in enumerate(names):
        ax.bar([i + j * width for i in range(len(groups))],
               [rows[f"{w}/b{b}/{mode}"]["ratio"] for w, b in groups], width, label=mode)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))],
                  [f"{w}\nbatch {b}" for w, b in groups])
    ax.set_ylabel("decode tok/s / plain")
    ax.set_title("radixgate drafters, SmolLM2-135M, 2 CPU threads")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
