"""Rotary embedding tables for every `Rope` a model's layers use.

Inverse frequencies follow HF transformers' `modeling_rope_utils` operation for operation, in
fp32 as it computes them (so a model's rotations match the reference bit for bit at the
frequency level); the angles position * inv_freq are then taken in fp64, which keeps long
positions exact where an fp32 product drifts.
"""

from __future__ import annotations

import math

import torch

from engine.config import Rope, RopeScaling


def _default_inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Low frequencies divided by `factor`, high ones kept, a smooth ramp between (Llama 3.1)."""
    old_context_len = s.original_max_position_embeddings
    low_freq_wavelen = old_context_len / s.low_freq_factor
    high_freq_wavelen = old_context_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_context_len / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(theta: float, head_dim: int, s: RopeScaling) -> tuple[torch.Tensor, float]:
    """NTK-by-parts interpolation (YaRN) and its attention factor."""
    attention_factor = s.attention_factor
    if attention_factor is None:
        if s.mscale and s.mscale_all_dim:
            attention_factor = (_yarn_mscale(s.factor, s.mscale)
                                / _yarn_mscale(s.factor, s.mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(s.factor)

    def correction_dim(num_rotations: float) -> float:
        return (head_dim * math.log(s.original_max_position_embeddings
                                    / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero in the ramp
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low),
                       0, 1)
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).to(torch.float32) / head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (s.factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = (interpolation * (1 - extrapolation_factor)
                + extrapolation * extrapolation_factor)
    return inv_freq, float(attention_factor)


def inverse_frequencies(rope: Rope, head_dim: int) -> tuple[torch.Tensor, float]:
    """fp32 (head_dim / 2,) inverse frequencies and the factor cos/sin are multiplied by."""
    scaling = rope.scaling
    attention_factor = 1.0
    if scaling is None:
        inv_freq = _default_inv_freq(rope.theta, head_dim)
    elif scaling.kind == "linear":
        inv_freq = _default_inv_freq(rope.theta, head_dim) / scaling.factor
    elif scaling.kind == "llama3":
        inv_freq = _llama3(_default_inv_freq(rope.theta, head_dim), scaling)
    else:
        inv_freq, attention_factor = _yarn(rope.theta, head_dim, scaling)
    if rope.freq_factors is not None:
        # llama.cpp divides each frequency's angle by its factor (ggml_rope_ext freq_factors).
        inv_freq = inv_freq / torch.tensor(rope.freq_factors, dtype=torch.float32)
    return inv_freq, attention_factor


def rotary_tables(rope: Rope, head_dim: int, num_positions: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (num_positions, head_dim) in the "rotate half" layout, times the rope's
    attention factor (YaRN)."""
    inv_freq, attention_factor = inverse_frequencies(rope, head_dim)
    angles = torch.outer(torch.arange(num_positions, dtype=torch.float64),
                         inv_freq.to(torch.float64))
    emb = torch.cat([angles, angles], dim=-1)
    return (emb.cos() * attention_factor).to(dtype), (emb.sin() * attention_factor).to(dtype)
