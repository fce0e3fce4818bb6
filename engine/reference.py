"""Reference generation: dense attention, no paging, no prefix cache.

The oracle every optimisation is compared with. `recompute=True` reruns the whole sequence for
every token (nothing carried between steps at all); the default keeps a contiguous per-request KV,
the plain textbook decode loop, which a test shows equal to the recompute path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from engine.attention.dense import DenseAttention, causal_attention
from engine.attention.spec import AttentionSpec
from engine.models.base import Model
from engine.sampling import make_generator, sample_row
from engine.sampling_params import SamplingParams


class ContiguousKVAttention:
    """Keeps each layer's K/V of one sequence in a growing contiguous tensor."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        old_k, old_v = self.keys[spec.layer_idx], self.values[spec.layer_idx]
        all_k = k if old_k is None else torch.cat([old_k, k])
        all_v = v if old_v is None else torch.cat([old_v, v])
        self.keys[spec.layer_idx], self.values[spec.layer_idx] = all_k, all_v
        return causal_attention(q, all_k, all_v, spec)


@dataclass
class GenerationStats:
    prompt_len: int = 0
    output_len: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str = "length"
    token_ids: list[int] = field(default_factory=list)

    @property
    def decode_tok_s(self) -> float:
        steps = max(self.output_len - 1, 0)
        return steps / self.decode_s if self.decode_s > 0 else 0.0


def reference_stream(
    model: Model,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    eos_token_ids: Sequence[int] = (),
    recompute: bool = False,
    stats: GenerationStats | None = None,
    should_stop: Callable[[list[int]], bool] | None = None,
) -> Iterator[int]:
    """Yield generated token ids one at a time until a stop token, `should_stop`, or max_tokens.

    A stop token (eos unless `ignore_eos`, or one of `params.stop_token_ids`) ends generation and
    is not yielded.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    # The dense weights on every step: packed decode weights are an optimisation under test.
    model = model.with_packed(None)
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_len = len(prompt_ids)
    stop_ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        stop_ids.update(eos_token_ids)
    generator = make_generator(params)
    tokens = list(prompt_ids)
    kv = ContiguousKVAttention(model.config.num_layers)
    started = time.perf_counter()
    step_ids, step_start = tokens, 0
    for step in range(params.max_tokens):
        if recompute:
            step_ids, step_start = tokens, 0
            attention: Callable[..., torch.Tensor] = DenseAttention([len(tokens)])
        else:
            attention = kv
        ids = torch.tensor(step_ids, dtype=torch.long)
        positions = torch.arange(step_start, step_start + len(step_ids))
        hidden = model.forward(ids, positions, attention)
        choice = sample_row(model.logits(hidden[-1:])[0], params, generator)
        now = time.perf_counter()
        if step == 0:
            stats.prefill_s = now - started
        else:
            stats.decode_s = now - started - stats.prefill_s
        if choice.token_id in stop_ids:
            stats.finish_reason = "stop"
            return
        tokens.append(choice.token_id)
        stats.token_ids.append(choice.token_id)
        stats.output_len += 1
        yield choice.token_id
        if should_stop is not None and should_stop(stats.token_ids):
            stats.finish_reason = "stop"
            return
        step_ids, step_start = [choice.token_id], len(tokens) - 1
    stats.finish_reason = "length"


def reference_generate(
    model: Model,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    eos_token_ids: Sequence[int] = (),
    recompute: bool = False,
) -> list[int]:
    """All tokens of `reference_stream` as a list."""
    return list(reference_stream(model, prompt_ids, params, eos_token_ids=eos_token_ids,
                                 recompute=recompute))
