"""Decode speed with speculative drafting off and on, side by side, on the embedded GGUF.

    python -m benchmarks.spec_decode --json bench-results/spec_decode.json [--quick]

Workloads (greedy, batch 1, real model): (a) `edit`: an agent re-emits a file it just read with
a small change; (b) `tool_call`: a JSON tool call after earlier calls in the history; (c) `prose`:
free text with little to copy. For each: decode tokens/s with drafting off and on (the trajectory
suffix drafter), the speedup, the mean accepted length (tokens per verify step) and whether the
outputs are identical. Where OpenVINO GenAI is installed, its prompt-lookup decoding on the same
GGUF is a peer column.
"""

from __future__ import annotations

import argparse
import json
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
from benchmarks.workload import SYSTEM, TOOLS, stdlib_source
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams


def _chatml(messages: list[tuple[str, str]], prefill: str = "") -> str:
    body = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in messages)
    return f"{body}<|im_start|>assistant\n{prefill}"


def workloads() -> dict[str, tuple[str, int]]:
    """name -> (prompt text, max new tokens)."""
    source = stdlib_source("textwrap.py")
    lines = source.splitlines(keepends=True)
    excerpt = "".join(lines[60:140])
    system = SYSTEM.format(tools="\n".join(json.dumps(t) for t in TOOLS))
    edit = _chatml([
        ("system", system),
        ("user", "In textwrap.py, rename the parameter `width` to `line_width` in the class "
                 "below and write the whole updated class back."),
        ("assistant", '<tool_call>\n{"name": "read_file", "arguments": {"path": "textwrap.py", '
                      '"start_line": 61, "end_line": 140}}\n</tool_call>'),
        ("user", f"<tool_response>\n{excerpt}</tool_response>"),
    ], prefill='<tool_call>\n{"name": "write_file", "arguments": {"path": "textwrap.py", '
               '"content": "' + "".join(lines[60:63]).replace("\n", "\\n"))
    calls = [
        ("search", {"pattern": "def wrap", "glob": "*.py"}),
        ("read_file", {"path": "textwrap.py", "start_line": 1, "end_line": 60}),
        ("run_shell", {"command": "python -m pytest -q tests/test_textwrap.py", "timeout_s": 60}),
        ("read_file", {"path": "tests/test_textwrap.py", "start_line": 1, "end_line": 80}),
    ]
    history: list[tuple[str, str]] = [("system", system),
                                      ("user", "Find why wrapping long words fails and fix it.")]
    for name, args in calls:
        history.append(("assistant", "<tool_call>\n" + json.dumps(
            {"name": name, "arguments": args}) + "\n</tool_call>"))
        history.append(("user", "<tool_response>\nok\n</tool_response>"))
    tool_call = _chatml(history, prefill="<tool_call>\n")
    prose = _chatml([("system", "You are a helpful assistant."),
                     ("user", "Write a short story about a lighthouse keeper who finds a "
                              "message in a bottle. Use vivid, varied language.")])
    return {"edit": (edit, 256), "tool_call": (tool_call, 96), "prose": (prose, 160)}


def decode_run(engine: Engine, ids: list[int], max_tokens: int, run_key: str) -> Finished:
    """One greedy request in a namespace and session of its own (`run_key`): the drafter must
    not copy an earlier repeat's output from its session corpus or recent-outputs window."""
    engine.submit(Extend(uuid.uuid4().hex, run_key, None, ids,
                         SamplingParams(max_tokens=max_tokens), session_id=run_key))
    return next(m for m in engine.run_until_idle() if isinstance(m, Finished))


def decode_tok_s(done: Finished) -> float:
    # The first token comes from the prefill; the rate counts the tokens after it.
    return (done.output_len - 1) / done.timings.decode_s if done.timings.decode_s > 0 else 0.0


def measure(loaded: LoadedModel, repeats: int, with_peer: bool) -> dict[str, Any]:
    # "ungated": drafting on every step (draft_backoff 0), to show what the gate saves.
    modes = {"none": ("none", 16), "suffix": ("suffix", 16), "ungated": ("suffix", 0)}
    engines = {name: Engine(loaded, EngineConfig(kv_memory_bytes=512 << 20, spec=spec,
                                                 draft_backoff=backoff,
                                                 enable_prefix_cache=False))
               for name, (spec, backoff) in modes.items()}
    peer = None
    if with_peer:
        try:
            from benchmarks.peers.openvino_peer import OpenVINOPeer
            peer = OpenVINOPeer(loaded.path, THREADS, prompt_lookup=True)
        except ImportError:
            log("openvino-genai is not installed: no peer column (pip install '.[bench]')")
    results: dict[str, Any] = {}
    for name, (text, max_tokens) in workloads().items():
        ids = loaded.tokenizer.encode(text)
        samples: dict[str, list[float]] = {"plain": [], "spec": [], "ungated": [], "peer": []}
        accepted_lens = []
        identical = True
        for r in range(repeats):
            plain = decode_run(engines["none"], ids, max_tokens, f"{name}-{r}")
            spec = decode_run(engines["suffix"], ids, max_tokens, f"{name}-{r}")
            ungated = decode_run(engines["ungated"], ids, max_tokens, f"{name}-{r}")
            identical &= (spec.output_token_ids == plain.output_token_ids
                          == ungated.output_token_ids)
            samples["plain"].append(decode_tok_s(plain))
            samples["spec"].append(decode_tok_s(spec))
            samples["ungated"].append(decode_tok_s(ungated))
            # Tokens after the prefill's first one (a stop token counts: it was generated).
            decoded = spec.output_len - 1 + (spec.stop_token_id is not None)
            steps = decoded - spec.num_accepted
            accepted_lens.append(decoded / steps if steps else float(decoded))
            if peer is not None:
                samples["peer"].append(peer.decode_tok_s(ids, plain.output_len))
            log(f"{name} #{r}: {plain.output_len} tokens, plain {samples['plain'][-1]:.1f} tok/s,"
                f" spec {samples['spec'][-1]:.1f} tok/s (ungated {samples['ungated'][-1]:.1f}),"
                f" accepted {spec.num_accepted}/"
                f"{spec.num_drafted} drafted")
        row: dict[str, Any] = {
            "prompt_len": len(ids), "output_len": plain.output_len,
            "plain_tok_s": statistics.median(samples["plain"]),
            "spec_tok_s": statistics.median(samples["spec"]),
            "ungated_tok_s": statistics.median(samples["ungated"]),
            # Per-repeat ratios (plain and spec run back to back), then their median: steadier
            # than a ratio of medians on a shared machine.
            "speedup_paired": statistics.median(
                s / p for s, p in zip(samples["spec"], samples["plain"], strict=True) if p),
            "min_speedup": min(
                s / p for s, p in zip(samples["spec"], samples["plain"], strict=True) if p),
            "mean_accepted_len": statistics.median(accepted_lens), "identical": identical,
            "output_preview": loaded.tokenizer.decode(plain.output_token_ids)[:160]}
        row["speedup"] = row["spec_tok_s"] / row["plain_tok_s"]
        if samples["peer"]:
            row["openvino_pld_tok_s"] = statistics.median(samples["peer"])
        results[name] = row
    return results


def summarise(result: dict[str, Any]) -> None:
    rows = result["workloads"]
    peer = any("openvino_pld_tok_s" in r for r in rows.values())
    headers = ["workload", "prompt", "output", "plain tok/s", "spec tok/s", "speedup",
               "min speedup", "ungated tok/s", "mean accepted", "identical"]
    headers += ["openvino pld tok/s", "spec/pld"] if peer else []
    table = []
    for name, r in rows.items():
        line = [name, r["prompt_len"], r["output_len"], r["plain_tok_s"], r["spec_tok_s"],
                r["speedup"], r["min_speedup"], r["ungated_tok_s"], r["mean_accepted_len"],
                r["identical"]]
        if peer:
            pld = r.get("openvino_pld_tok_s")
            line += [pld, r["spec_tok_s"] / pld if pld else None]
        table.append(line)
    print(f"\nSpeculative decoding (trajectory suffix drafter), greedy, batch 1, "
          f"{result['notes'].get('precision', 'fp32')}, medians of {result['repeats']}")
    print(format_table(headers, table))
    print(load_line(result["notes"]))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["workloads"]
    names = list(rows)
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [rows[n]["plain_tok_s"] for n in names], 0.4, label="plain")
    ax.bar([x + 0.2 for x in xs], [rows[n]["spec_tok_s"] for n in names], 0.4,
           label="suffix drafter")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("decode tokens/s")
    ax.set_title("radixgate speculative decoding, SmolLM2-135M, 2 CPU threads")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=Path("bench-results/spec_decode.json"))
    parser.add_argument("--quick", action="store_true", help="one repeat, no peer")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-peers", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    loaded = load_default_model()
    notes = machine_notes(loaded.path)
    notes["precision"] = precision_label(loaded)
    repeats = args.repeats or (1 if args.quick else 5)
    result = {"notes": notes, "repeats": repeats,
              "workloads": measure(loaded, repeats, with_peer=not args.no_peers)}
    finish_notes(notes)
    summarise(result)
    write_json(args.json, result)
    plot(result, plot_path(args.json))
    log(f"wrote {args.json} and {plot_path(args.json)}")


if __name__ == "__main__":
    main()
