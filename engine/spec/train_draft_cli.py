"""`radixgate train-draft`'s options, without importing torch (the console script's parser is
built on every `radixgate --help`, also where only the SDK is installed); the command itself
runs `engine.spec.eagle3_train.train_draft_main`."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_train_draft_subcommand(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("train-draft", help="train an EAGLE-3 draft head for the model on the "
                       "CPU (its own responses to built-in prompts); writes the public format")
    p.add_argument("--model", default=None,
                   help="a .gguf file or an HF folder (default: the embedded SmolLM2-135M)")
    p.add_argument("--out", type=Path, required=True, help="the head folder to write")
    p.add_argument("--num-samples", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--ttt-length", type=int, default=7,
                   help="draft steps unrolled in training (EAGLE-3's training-time test)")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of the regenerated responses (default greedy, "
                        "as served; SpecForge uses 0.7, which samples ~6x slower here)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capture-layers", default=None,
                   help="comma-separated target layers whose input streams feed the head "
                        "(default 2, L//2, L-3)")
    p.add_argument("--save-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/train (samples and optimizer state)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "mixed"],
                   help="the target's dtype when generating and capturing (auto: as served)")
    p.set_defaults(func=_run)



def _run(args: argparse.Namespace) -> int:
    from engine.spec.eagle3_train import train_draft_main

    return train_draft_main(args)
