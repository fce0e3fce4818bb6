"""`radixgate train-draft`: train an EAGLE-3 head for the served model on the CPU and write it in
the public format (config.json + model.safetensors, `LlamaForCausalLMEagle3`).

    1. prompts (eagle3_prompts) -> the target's own responses (eagle3_data.generate_samples),
       kept in OUT/train/samples.json so `--resume` does not regenerate them;
    2. the draft vocabulary: the `--draft-vocab` most frequent response tokens;
    3. one dense target pass per sample: captured layers, final hidden, greedy tokens;
    4. AdamW over the TTT loss (eagle3_trainable), one sequence a step, grad clip 0.5, linear
       warmup then cosine decay; OUT/train/state.pt after every `--save-every` steps and the
       head in OUT after each, so a stopped run leaves a usable head and `--resume` continues.

The head has the target's layer shape (H = target hidden). Its lm_head starts as the target's
lm_head rows of the draft vocabulary and its final norm as the target's: the head's output
hidden imitates the target's last hidden state, so that start is close already.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import Rope
from engine.models.ggml_weight import dense_table, embedding
from engine.models.loader import LoadedModel
from engine.spec.eagle3_checkpoint import (
    D2T,
    EMBED,
    LM_HEAD,
    Eagle3Checkpoint,
    expected_shapes,
    save_eagle3_head,
)
from engine.spec.eagle3_config import Eagle3Config, default_captured_layer_ids
from engine.spec.eagle3_data import (
    Captured,
    Sample,
    capture_sample,
    draft_vocabulary,
    generate_samples,
)
from engine.spec.eagle3_prompts import training_prompts
from engine.spec.eagle3_trainable import TrainableEagle3Head, TTTResult

EVAL_FRACTION = 0.05  # samples held out for the reported accuracies


@dataclass(frozen=True)
class TrainOptions:
    out: Path
    num_samples: int = 512
    max_new_tokens: int = 160
    epochs: int = 2
    lr: float = 3e-4
    ttt_length: int = 7
    draft_vocab: int = 8192
    resume: bool = False
    temperature: float = 0.0
    seed: int = 0
    capture_layers: tuple[int, ...] | None = None  # None: (2, L//2, L-3)
    save_every: int = 100
    log_every: int = 20


def train_draft_main(args: argparse.Namespace) -> int:
    from engine.models.loader import auto_cpu_dtype, load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = auto_cpu_dtype()[1].dtype if args.dtype == "auto" else args.dtype
    layers = (tuple(int(i) for i in args.capture_layers.split(","))
              if args.capture_layers else None)
    options = TrainOptions(
        out=args.out, num_samples=args.num_samples, max_new_tokens=args.max_new_tokens,
        epochs=args.epochs, lr=args.lr, ttt_length=args.ttt_length,
        draft_vocab=args.draft_vocab, resume=args.resume, temperature=args.temperature,
        seed=args.seed, capture_layers=layers, save_every=args.save_every)
    train_draft(load_model(args.model, "fp32" if dtype == "int8" else dtype), options)
    return 0


def _log(message: str) -> None:
    print(f"train-draft: {message}", file=sys.stderr, flush=True)


def head_config(loaded: LoadedModel, draft_vocab: int, layers: tuple[int, ...]) -> Eagle3Config:
    t = loaded.model.config
    return Eagle3Config(
        hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_heads=t.num_heads, num_kv_heads=t.num_kv_heads, head_dim=t.head_dim,
        rms_norm_eps=t.rms_norm_eps, rope=Rope(t.rope_theta, t.rope_scaling),
        max_position_embeddings=t.max_position_embeddings, vocab_size=t.vocab_size,
        draft_vocab_size=draft_vocab, target_hidden_size=t.hidden_size,
        tie_word_embeddings=False, captured_layer_ids=tuple(sorted(layers)))


def initial_tensors(loaded: LoadedModel, config: Eagle3Config, draft_ids: torch.Tensor,
                    seed: int) -> dict[str, torch.Tensor]:
    """Llama's init (normal 0.02, norms 1) except fc (identity on the last captured layer),
    lm_head and the final norm (the target's; module doc)."""
    gen = torch.Generator().manual_seed(seed)
    weights = loaded.model.weights
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(config).items():
        if name in (D2T, EMBED):
            continue
        out[name] = (torch.ones(shape) if len(shape) == 1
                     else torch.randn(shape, generator=gen) * 0.02)
    # fc starts as "pass the last captured stream through" (plus the noise): the head's output
    # then starts near a late target hidden state, on the scale the lm_head rows expect.
    h = config.hidden_size
    out["fc.weight"][:, -h:] += torch.eye(h)
    out[LM_HEAD] = embedding(draft_ids, weights.lm_head).float().clone()
    out["norm.weight"] = weights.norm.float().clone()
    return out


def _samples(loaded: LoadedModel, options: TrainOptions, work: Path) -> list[Sample]:
    path = work / "samples.json"
    if options.resume and path.is_file():
        raw = json.loads(path.read_text())
        _log(f"resuming with {len(raw)} samples from {path}")
        return [Sample(tuple(s["token_ids"]), s["response_start"]) for s in raw]
    started = time.perf_counter()
    samples = generate_samples(loaded, training_prompts(options.num_samples, options.seed),
                               max_new_tokens=options.max_new_tokens,
                               temperature=options.temperature, seed=options.seed)
    path.write_text(json.dumps([{"token_ids": list(s.token_ids),
                                 "response_start": s.response_start} for s in samples]))
    num_new = sum(s.num_tokens - s.response_start for s in samples)
    _log(f"generated {len(samples)} samples ({num_new} response tokens) in "
         f"{time.perf_counter() - started:.0f} s")
    return samples


def _lr_at(step: int, total: int, lr: float) -> float:
    warmup = max(1, total // 50)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train_draft(loaded: LoadedModel, options: TrainOptions) -> TrainableEagle3Head:
    """Run the whole recipe (module docstring) and write the head into `options.out`.
    Progress goes to stderr. Returns the trained module."""
    work = options.out / "train"
    work.mkdir(parents=True, exist_ok=True)
    samples = _samples(loaded, options, work)
    layers = options.capture_layers or default_captured_layer_ids(loaded.model.config.num_layers)
    draft_ids = draft_vocabulary(samples, loaded.model.config.vocab_size, options.draft_vocab)
    config = head_config(loaded, options.draft_vocab, layers)
    head = TrainableEagle3Head(config, initial_tensors(loaded, config, draft_ids, options.seed),
                               dense_table(loaded.model.weights.embed), draft_ids)
    optimizer = torch.optim.AdamW(head.parameters(), lr=options.lr, weight_decay=0.0)
    state_path = work / "state.pt"
    done_steps = 0
    if options.resume and state_path.is_file():
        state = torch.load(state_path, weights_only=True)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        done_steps = int(state["step"])
        _log(f"resuming at step {done_steps}")
    started = time.perf_counter()
    captured = [capture_sample(loaded, s, layers) for s in samples]
    _log(f"captured {len(samples)} samples in {time.perf_counter() - started:.0f} s")
    lm_rows = embedding(draft_ids, loaded.model.weights.lm_head).float()
    num_eval = max(1, int(len(samples) * EVAL_FRACTION)) if len(samples) > 1 else 0
    train_idx = list(range(len(samples) - num_eval))
    total = options.epochs * len(train_idx)
    window: list[tuple[float, int, int]] = []
    started = time.perf_counter()
    for step in range(done_steps, total):
        epoch, index = divmod(step, len(train_idx))
        order = train_idx[:]
        random.Random(options.seed + epoch).shuffle(order)
        i = order[index]
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, total, options.lr)
        result = _ttt(head, samples[i], captured[i], lm_rows, options.ttt_length)
        optimizer.zero_grad(set_to_none=True)
        if result.loss.requires_grad:
            result.loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            optimizer.step()
        window.append((float(result.loss.detach()),
                       result.step_correct[0] if result.step_correct else 0,
                       result.step_rows[0] if result.step_rows else 0))
        if (step + 1) % options.log_every == 0 or step + 1 == total:
            rows = sum(w[2] for w in window)
            _log(f"epoch {epoch + 1}/{options.epochs} step {step + 1}/{total}: loss "
                 f"{sum(w[0] for w in window) / len(window):.3f}, step-0 acc "
                 f"{sum(w[1] for w in window) / max(rows, 1):.3f} "
                 f"({(time.perf_counter() - started) / (step + 1 - done_steps):.2f} s/step)")
            window.clear()
        if (step + 1) % options.save_every == 0 or step + 1 == total:
            torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step + 1}, state_path)
            write_head(head, options.out)
    if num_eval:
        evaluate(head, samples[-num_eval:], captured[-num_eval:], lm_rows, options.ttt_length)
    write_head(head, options.out)
    _log(f"wrote {options.out}")
    return head


def _ttt(head: TrainableEagle3Head, sample: Sample, captured: Captured, lm_rows: torch.Tensor,
         ttt_length: int) -> TTTResult:
    target_logits = captured.hidden.float() @ lm_rows.T
    return head.ttt_loss(torch.tensor(sample.token_ids), captured.features, target_logits,
                         captured.argmax, sample.response_start, ttt_length)


@torch.no_grad()
def evaluate(head: TrainableEagle3Head, samples: list[Sample], captured: list[Captured],
             lm_rows: torch.Tensor, ttt_length: int) -> list[float]:
    """Top-1 accuracy against the target's argmax per unrolled step on held-out samples
    (logged); step k counts rows whose earlier steps were fed the head's own hidden."""
    correct = [0] * ttt_length
    rows = [0] * ttt_length
    for sample, cap in zip(samples, captured, strict=True):
        result = _ttt(head, sample, cap, lm_rows, ttt_length)
        for k, (c, n) in enumerate(zip(result.step_correct, result.step_rows, strict=True)):
            correct[k] += c
            rows[k] += n
    accuracy = [c / n if n else 0.0 for c, n in zip(correct, rows, strict=True)]
    _log(f"held-out accuracy per step ({len(samples)} samples): "
         + " ".join(f"{a:.3f}" for a in accuracy))
    return accuracy


def write_head(head: TrainableEagle3Head, out: Path) -> None:
    """The head in the public format in `out`, weights in bf16 (d2t int64)."""
    save_eagle3_head(out, Eagle3Checkpoint(head.config, head.public_tensors(torch.bfloat16)))
