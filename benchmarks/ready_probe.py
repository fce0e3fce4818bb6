"""Ready time and peak resident memory of one engine, each in a fresh process.

`measure_ready` (model_speed's ready rows) starts `python -m benchmarks.ready_probe ENGINE ...`
per probe and reads the one JSON line it prints. Every timestamp is `time.monotonic()`
(CLOCK_MONOTONIC, one clock for all processes), taken from the parent's spawn:

- ready_s: spawn to the engine being able to run a request (interpreter start and imports
  included). radixgate: `load_model` plus the `Engine` (serving defaults: 1 GiB KV pool, no
  drafting); a peer: its model object constructed (OpenVINO GenAI converts the GGUF here).
- load_s: the model load alone (`load_model`; a peer's constructor), reported apart.
- first_token_s: spawn to the first token of a 32-token prompt (greedy).
- peak_rss_bytes: the process's peak RSS (VmHWM of /proc/self/status) once 8 tokens were
  generated. Touched pages of the memory-mapped GGUF count as resident, as every mapped page
  does. Not `ru_maxrss`: Linux carries the spawning process's peak across exec into it (a bare
  interpreter spawned by a 1.3 GB process reports 1.3 GB), so it is kept only as
  `ru_maxrss_bytes`, for reference.
- kv_bytes: the KV memory the engine reserved (radixgate's pool; llama.cpp's n_ctx at f16;
  OpenVINO's `cache_size`).

A peer's probe imports no torch. The page cache is warm (the parent hashed the GGUF), and one
discarded probe per engine runs first; the timed probes take turns, engine after engine.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPT_TOKENS = 32
GEN_TOKENS = 8


def _probe_radixgate(args: argparse.Namespace, prompt: list[int]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    from engine.engine import Engine, EngineConfig
    from engine.models.loader import load_model
    from engine.protocol import Extend, Finished
    from engine.sampling_params import SamplingParams

    t_load = time.monotonic()
    loaded = load_model(args.model, args.dtype, show_progress=False)
    t_loaded = time.monotonic()
    engine = Engine(loaded, EngineConfig(spec="none"))
    t_ready = time.monotonic()
    engine.submit(Extend("probe", "probe", None, prompt,
                         SamplingParams(max_tokens=GEN_TOKENS, ignore_eos=True)))
    done = next(m for m in engine.run_until_idle() if isinstance(m, Finished))
    kv = sum(t.numel() * t.element_size() for t in engine.kv_pool.k + engine.kv_pool.v)
    return {"t_load": t_load, "t_loaded": t_loaded, "t_ready": t_ready,
            "t_first": t_ready + done.timings.ttft_s, "kv_bytes": kv,
            "tokens": done.output_token_ids}


def _probe_peer(args: argparse.Namespace, prompt: list[int]) -> dict[str, Any]:
    peer: Any
    t_load = time.monotonic()
    if args.engine == "llama.cpp":
        from benchmarks.peers.llama_cpp_peer import LlamaCppPeer

        peer = LlamaCppPeer(args.model, args.threads, n_ctx=args.n_ctx)
    else:
        from benchmarks.peers.openvino_peer import CACHE_SIZE_GB, OpenVINOPeer

        peer = OpenVINOPeer(args.model, args.threads)
    t_ready = time.monotonic()
    first = peer.ttft(prompt)
    tokens = peer.generate_greedy(prompt, GEN_TOKENS)
    peer.close()
    kv = args.kv_bytes if args.engine == "llama.cpp" else CACHE_SIZE_GB * (1 << 30)
    return {"t_load": t_load, "t_loaded": t_ready, "t_ready": t_ready,
            "t_first": t_ready + first, "kv_bytes": kv, "tokens": tokens}


def _vm_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def probe_main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=["radixgate", "llama.cpp", "openvino-genai"])
    parser.add_argument("--model", required=True, help="GGUF path")
    parser.add_argument("--dtype", default="fp32", help="radixgate's --dtype")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=8192, help="llama.cpp's context")
    parser.add_argument("--kv-bytes", type=int, default=0, help="llama.cpp's KV at n_ctx")
    parser.add_argument("--prompt", required=True, help="comma-separated token ids")
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt.split(",")]
    probe = _probe_radixgate if args.engine == "radixgate" else _probe_peer
    out = probe(args, prompt)
    out["peak_rss_bytes"] = _vm_hwm_bytes()
    out["ru_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out), flush=True)


def run_probe(argv: list[str], timeout_s: float = 900) -> dict[str, Any]:
    """One fresh process: its figures in seconds from the spawn, or {"error": ...}."""
    spawned = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.ready_probe", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " ".join((proc.stderr or proc.stdout).split()[-40:])
        return {"error": f"exit {proc.returncode}: {tail}"}
    raw = json.loads(lines[-1])
    return {"ready_s": raw["t_ready"] - spawned, "load_s": raw["t_loaded"] - raw["t_load"],
            "startup_s": raw["t_load"] - spawned, "first_token_s": raw["t_first"] - spawned,
            "peak_rss_bytes": raw["peak_rss_bytes"], "ru_maxrss_bytes": raw["ru_maxrss_bytes"],
            "kv_bytes": raw["kv_bytes"],
            "tokens": raw["tokens"]}


def measure_ready(probes: dict[str, list[str]], repeats: int, *,
                  warmup: bool = True) -> dict[str, Any]:
    """{engine: {figure: median_of, ..., "samples": [...]}} over `repeats` probes per engine
    (engines take turns, starting one later each round), after one discarded probe each."""
    from benchmarks.common import log, median_of

    names = list(probes)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    errors: dict[str, str] = {}
    rounds = ([-1] if warmup else []) + list(range(repeats))
    for r in rounds:
        order = names[max(r, 0) % len(names):] + names[:max(r, 0) % len(names)]
        for name in order:
            if name in errors:
                continue
            log(f"ready probe: {name} ({'warm-up' if r < 0 else f'{r + 1}/{repeats}'})")
            result = run_probe(probes[name])
            if "error" in result:
                errors[name] = result["error"]
                log(f"ready probe {name} failed: {result['error']}")
            elif r >= 0:
                samples[name].append(result)
    out: dict[str, Any] = {}
    for name in names:
        if name in errors:
            out[name] = {"error": errors[name]}
            continue
        runs = samples[name]
        out[name] = {key: median_of([s[key] for s in runs])
                     for key in ("ready_s", "load_s", "startup_s", "first_token_s",
                                 "peak_rss_bytes")}
        out[name]["kv_bytes"] = runs[-1]["kv_bytes"]
        out[name]["tokens"] = runs[-1]["tokens"]
    return out


if __name__ == "__main__":
    probe_main()
