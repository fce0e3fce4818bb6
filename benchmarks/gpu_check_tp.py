"""`--tp 2` on two GPUs (NCCL): greedy tokens equal `--tp 1`, and decode tok/s of both.

    python benchmarks/gpu_check_tp.py --out DIR            # gpu_check.sh runs it on 2+ GPUs
    python benchmarks/gpu_check_tp.py --out DIR --dry-run  # the CPU with gloo, a tiny model

A random-weight Llama (8 heads, 8 KV heads: both split by 2) with the embedded model's
tokenizer runs 4 prompts greedily through the engine at tp 1 and tp 2; the tokens must match
(bf16 on the GPU rounds each rank's partial sums, so the check there is on fp32 weights).
Writes `tp.json` under --out and prints one line per case.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.engine import Engine, EngineConfig
from engine.models.decoder import DecoderModel
from engine.models.loader import LoadedModel
from engine.models.locate import embedded_gguf_path
from engine.models.weights import LayerWeights, ModelWeights
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer


def random_llama(tokenizer: Tokenizer, hidden: int, layers: int) -> LoadedModel:
    heads = 8
    cfg = ModelConfig(architecture="llama", num_layers=layers, hidden_size=hidden,
                      intermediate_size=4 * hidden, num_heads=heads, num_kv_heads=heads,
                      head_dim=hidden // heads, vocab_size=tokenizer.vocab_size,
                      rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.05

    inter = cfg.intermediate_size
    blocks = [LayerWeights(torch.ones(hidden), rand(cfg.q_size + 2 * cfg.kv_size, hidden), None,
                           rand(hidden, cfg.q_size), torch.ones(hidden),
                           rand(2 * inter, hidden), rand(hidden, inter))
              for _ in range(layers)]
    embed = rand(cfg.vocab_size, hidden)
    weights = ModelWeights(embed=embed, layers=blocks, norm=torch.ones(hidden), lm_head=embed)
    return LoadedModel(Path("random-llama"), DecoderModel(cfg, weights, torch.float32),
                       tokenizer, 0.0)


def run(loaded: LoadedModel, tp: int, device: str, max_tokens: int) -> tuple[list[list[int]],
                                                                          float]:
    """Greedy tokens of 4 prompts in one batch, and the decode tok/s of that batch."""
    engine = Engine(loaded, EngineConfig(tp=tp, device=device, kv_memory_bytes=256 << 20,
                                         cuda_graphs=False))
    try:
        prompts = [[1 + i, 5, 9, 300 + i, 20, 44, 80, 7] * 8 for i in range(4)]
        for i, ids in enumerate(prompts):
            engine.submit(Extend(f"r{i}", "ns", None, ids,
                                 SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
        started = time.perf_counter()
        done = {m.request_id: m for m in engine.run_until_idle() if isinstance(m, Finished)}
        elapsed = time.perf_counter() - started
        return [done[f"r{i}"].output_token_ids for i in range(4)], 4 * max_tokens / elapsed
    finally:
        engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.dry_run and torch.cuda.device_count() < 2:
        print("tp: skipped (fewer than 2 GPUs)")
        return 0
    device = "cpu" if args.dry_run else "cuda:0"
    hidden, layers, max_tokens = (64, 2, 8) if args.dry_run else (1024, 8, 64)
    loaded = random_llama(Tokenizer.from_gguf(embedded_gguf_path()), hidden, layers)
    want, rate_1 = run(loaded, 1, device, max_tokens)
    got, rate_2 = run(loaded, 2, device, max_tokens)
    result = {"device": device, "equal": got == want, "tok_s_tp1": rate_1, "tok_s_tp2": rate_2}
    (args.out / "tp.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"tp: greedy tp2 == tp1: {'ok' if got == want else 'FAIL'}; decode {rate_1:.0f} "
          f"tok/s at tp 1, {rate_2:.0f} at tp 2 ({device})")
    return 0 if got == want else 1


if __name__ == "__main__":
    sys.exit(main())
