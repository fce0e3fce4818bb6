"""The extend arithmetic behind the agent-replay sweep's predicted TTFT."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.flops import ExtendFlops, Rates, extend_flops
from engine.config import FULL, SLIDING, ModelConfig


def _config(**overrides: object) -> ModelConfig:
    # SmolLM2-135M's shape.
    config = ModelConfig(
        architecture="llama", num_layers=30, hidden_size=576, intermediate_size=1536,
        num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=49152, rope_theta=100000.0,
        rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True)
    return dataclasses.replace(config, **overrides)  # type: ignore[arg-type]


def test_dense_model_matches_the_hand_count() -> None:
    # performance.md §2a: 212e6 FLOPs per new token in the projections, 69,120 per
    # (new, cached) pair in attention; the lm_head runs for the last row only.
    flops = extend_flops(_config(), 1000, 256)
    pairs = sum(p + 1 for p in range(1000, 1256))
    assert flops.linear == pytest.approx(256 * 212.3e6 + 2 * 576 * 49152, rel=1e-3)
    assert flops.attention == 69_120 * pairs


def test_sliding_layers_see_only_their_window() -> None:
    window = 512
    types = tuple(FULL if i % 6 == 5 else SLIDING for i in range(30))
    config = _config(sliding_window=window, layer_types=types)
    near, far = extend_flops(config, 1000, 256), extend_flops(config, 31000, 256)
    per_pair = 4 * 9 * 64
    full_growth = 5 * per_pair * 256 * 30000  # only the 5 full layers see the extra keys
    assert far.attention - near.attention == full_growth
    assert far.linear == near.linear
    # A query at position p < window sees p + 1 keys in every layer.
    assert extend_flops(config, 0, 1).attention == 30 * per_pair


def test_rates_add_the_two_parts() -> None:
    rates = Rates(linear=100e9, attention=20e9)
    assert rates.seconds(ExtendFlops(linear=50e9, attention=10e9)) == pytest.approx(1.0)
