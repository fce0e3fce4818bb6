"""Training data for an EAGLE-3 head: the target's own responses, its features and its logits.

    generate_samples   chat prompts (eagle3_prompts) rendered with the target's chat template,
                       answered by the target itself through the batched engine (eagle3.md §3:
                       EAGLE and SpecForge regenerate responses with the target).
    draft_vocabulary   the most frequent response tokens (SpecForge's `scandata`): d2t.
    capture_sample     one dense `forward_captured` over prompt + response: the captured layers
                       (the head's input), the final normed hidden (the target logits over the
                       draft vocabulary are `hidden @ lm_head[draft ids].T`, computed when
                       training, so no (T, vocab) tensor is stored) and the target's argmax.

A sample's loss mask is its response: token j counts when j >= `response_start`.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass

import torch

from engine.attention.dense import DenseAttention
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Failed, Finished
from engine.sampling_params import SamplingParams
from engine.spec.eagle3_prompts import Message


@dataclass(frozen=True)
class Sample:
    """One training sequence: prompt + response token ids; the response starts at
    `response_start` (the loss mask)."""

    token_ids: tuple[int, ...]
    response_start: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Captured:
    """A sample's target pass, on the CPU. `features`: (T, k * Ht) bf16, the captured layers
    side by side; `hidden`: (T, Ht) bf16, the final normed hidden (the target's logits at t
    are `hidden[t] @ lm_head.T`); `argmax`: (T,) int64, the target's greedy next token at t."""

    features: torch.Tensor
    hidden: torch.Tensor
    argmax: torch.Tensor


def render_prompt(loaded: LoadedModel, messages: list[Message]) -> list[int]:
    """Token ids of `messages` with the model's chat template and the generation prompt (plain
    concatenated contents, with BOS if the model adds one, when it has no template)."""
    tok = loaded.tokenizer
    if tok.chat_template is not None:
        return tok.encode(tok.chat_template.render(messages, add_generation_prompt=True))
    ids = tok.encode("\n\n".join(m["content"] for m in messages) + "\n\n")
    return [tok.bos_token_id, *ids] if tok.add_bos_token and tok.bos_token_id is not None \
        else ids


def generate_samples(loaded: LoadedModel, prompts: list[list[Message]], *, max_new_tokens: int,
                     temperature: float, seed: int, batch_size: int = 32,
                     log_every: int = 32) -> list[Sample]:
    """The target's responses to `prompts`, `batch_size` requests in flight at a time, in prompt
    order. A response keeps its stop token (the head must learn to predict it too). Requests
    that fail are dropped (and reported on stderr). Progress goes to stderr."""
    engine = Engine(loaded, EngineConfig(kv_memory_bytes=256 << 20, spec="none",
                                         enable_prefix_cache=True))
    prompt_ids = [render_prompt(loaded, p) for p in prompts]
    done: dict[int, Sample] = {}
    for start in range(0, len(prompt_ids), batch_size):
        for i in range(start, min(start + batch_size, len(prompt_ids))):
            params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature,
                                    seed=seed + i)
            engine.submit(Extend(f"s{i}", "train-draft", None, prompt_ids[i], params))
        for message in engine.run_until_idle():
            if isinstance(message, Finished):
                i = int(message.request_id[1:])
                response = list(message.output_token_ids)
                if message.stop_token_id is not None and (
                        not response or response[-1] != message.stop_token_id):
                    response.append(message.stop_token_id)
                done[i] = Sample(tuple(prompt_ids[i] + response), len(prompt_ids[i]))
            elif isinstance(message, Failed):
                print(f"train-draft: sample {message.request_id} failed: {message.message}",
                      file=sys.stderr)
        if len(done) // log_every != (len(done) - batch_size) // log_every or \
                start + batch_size >= len(prompt_ids):
            print(f"train-draft: generated {len(done)}/{len(prompt_ids)} samples",
                  file=sys.stderr, flush=True)
    return [done[i] for i in sorted(done)]


def draft_vocabulary(samples: list[Sample], vocab_size: int, draft_vocab_size: int
                     ) -> torch.Tensor:
    """The draft vocabulary: (draft_vocab_size,) int64 target ids, ascending, the most frequent
    response tokens first chosen (ties by lower id), topped up with the lowest unused ids when
    the responses hold fewer distinct tokens. d2t is `ids - arange(draft_vocab_size)`. Raises
    ValueError when the draft vocabulary is larger than the target's."""
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft vocabulary of {draft_vocab_size} for a target vocabulary of "
                         f"{vocab_size}")
    counts: Counter[int] = Counter()
    for s in samples:
        counts.update(s.token_ids[s.response_start:])
    chosen = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    chosen = chosen[:draft_vocab_size]
    if len(chosen) < draft_vocab_size:
        taken = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in taken][:draft_vocab_size - len(chosen)]
    return torch.tensor(sorted(chosen), dtype=torch.int64)


def capture_sample(loaded: LoadedModel, sample: Sample, layers: tuple[int, ...]) -> Captured:
    """One dense target pass over `sample` (no KV pool). Pure (the model is not changed). The
    tensors are ordinary ones (not inference tensors), so autograd may read them."""
    n = sample.num_tokens
    with torch.inference_mode():
        hidden, aux = loaded.model.forward_captured(torch.tensor(sample.token_ids),
                                                    torch.arange(n), DenseAttention([n]), layers)
        if aux is None:
            raise ValueError("capture_sample needs at least one captured layer")
        argmax = loaded.model.logits(hidden).argmax(-1)
        features, final = aux.to(torch.bfloat16), hidden.to(torch.bfloat16)
    # Cloned outside inference mode: inference tensors cannot be saved for backward.
    return Captured(features.clone(), final.clone(), argmax.clone())
