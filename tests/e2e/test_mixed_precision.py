"""The documented tolerance of `--dtype mixed` against the fp32 reference on the real model.

Bound (measured 2026-12-04 on 8 x 300 teacher-forced positions: mean |dlogit| 0.05, max 0.75,
argmax agreement 98.3-100%, no disagreement where fp32's top-2 margin exceeded 0.5):
- mean |logit difference| <= 0.1 and max <= 1.5 (logits' std is ~6.5);
- the next-token argmax agrees on >= 97% of positions, and on every position where the fp32
  top-2 margin is above 1.0: mixed precision can only flip near-ties;
- free-running greedy through the engine: 32 tokens identical on >= 12 of 16 prompts (14 seen).

On a CPU without bf16 instructions, where `mixed` is never the default and torch emulates the
bf16 GEMMs (~7 GFLOP/s on 2 AVX2 cores: 150 s for the full greedy test), the same bounds are
checked on half the prompts (2 for the logits, >= 6 of 8 identical for greedy).
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.model_speed import corpus_ids
from engine.attention.dense import DenseAttention
from engine.models.loader import LoadedModel, cpu_has_bf16
from engine.models.weights import MixedPrecision
from tests.e2e.greedy import greedy_outputs

pytestmark = pytest.mark.slow

PROMPT_LEN = 300
# Prompts of the greedy test; the logits test takes a quarter of them.
NUM_PROMPTS = 16 if cpu_has_bf16() else 8


def _prompts(loaded: LoadedModel, count: int) -> list[list[int]]:
    ids = corpus_ids(loaded.tokenizer, 450 * count)
    return [ids[i * 450 : i * 450 + PROMPT_LEN] for i in range(count)]


def test_mixed_logits_within_tolerance(loaded_model: LoadedModel) -> None:
    reference = loaded_model.model
    mixed = reference.with_mixed_precision(MixedPrecision())
    positions = torch.arange(PROMPT_LEN)
    for prompt in _prompts(loaded_model, NUM_PROMPTS // 4):
        ids = torch.tensor(prompt)
        want = reference.logits(reference.forward(ids, positions, DenseAttention([PROMPT_LEN])))
        got = mixed.logits(mixed.forward(ids, positions, DenseAttention([PROMPT_LEN])))
        diff = (got - want).abs()
        assert diff.mean() <= 0.1 and diff.max() <= 1.5, (diff.mean(), diff.max())
        top2 = want.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        disagree = want.argmax(-1) != got.argmax(-1)
        assert disagree.float().mean() <= 0.03
        assert not (disagree & (margin > 1.0)).any(), margin[disagree]


def test_mixed_greedy_matches_fp32_on_most_prompts(loaded_model: LoadedModel) -> None:
    prompts = _prompts(loaded_model, NUM_PROMPTS)
    mixed = LoadedModel(loaded_model.path, loaded_model.model.with_mixed_precision(
        MixedPrecision()), loaded_model.tokenizer, 0.0)
    want = greedy_outputs(loaded_model, prompts)
    got = greedy_outputs(mixed, prompts)
    identical = sum(a == b for a, b in zip(want, got, strict=True))
    assert identical >= NUM_PROMPTS * 3 // 4, f"{identical}/{NUM_PROMPTS} identical"
