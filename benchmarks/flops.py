"""The arithmetic of one extend (new tokens appended to a cached context) for any model the engine
runs, and the time it predicts at rates measured on this machine.

FLOPs count a multiply-add as 2. Projections: q, k, v, o and the MLP (or the routed experts' share
and the router for MoE layers) per new token; the lm_head once (only the last row's logits are
computed). Attention: QK^T and PV per (query, key) pair per head, 4 * head_dim FLOPs, where a
sliding layer's query sees at most its window of keys.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.attention.base import PagedAttentionBackend, PagedBatch
from engine.attention.spec import AttentionSpec
from engine.config import ModelConfig
from engine.kv_pool import KVLayout, KVPool


@dataclass(frozen=True)
class ExtendFlops:
    linear: float  # projections and lm_head
    attention: float

    @property
    def total(self) -> float:
        return self.linear + self.attention


@dataclass(frozen=True)
class Rates:
    """FLOP/s measured on this machine: the engine's projections, and its attention backend
    over a long cached context."""

    linear: float
    attention: float

    def seconds(self, flops: ExtendFlops) -> float:
        return flops.linear / self.linear + flops.attention / self.attention


def _projection_flops_per_token(config: ModelConfig, layer_idx: int) -> float:
    h = config.hidden_size
    attn = h * config.q_size * 2 + h * config.kv_size * 2  # q and o; k and v
    moe = config.moe
    if moe is not None and layer_idx in moe.layers:
        mlp = 3 * h * moe.intermediate_size * moe.top_k + h * moe.num_experts
    else:
        mlp = 3 * h * config.intermediate_size
    return 2.0 * (attn + mlp)


def _pairs(context_len: int, delta: int, window: int | None) -> float:
    """(query, key) pairs of `delta` queries at positions context_len.. over causal keys, each
    seeing at most `window` keys."""
    total = 0.0
    for pos in range(context_len, context_len + delta):
        total += pos + 1 if window is None else min(pos + 1, window)
    return total


def extend_flops(config: ModelConfig, context_len: int, delta: int) -> ExtendFlops:
    """FLOPs to append `delta` tokens to `context_len` cached ones and produce one token's
    logits."""
    linear = sum(_projection_flops_per_token(config, i) for i in range(config.num_layers)) * delta
    linear += 2.0 * config.hidden_size * config.vocab_size
    per_pair = 4.0 * config.num_heads * config.head_dim
    attention = sum(per_pair * _pairs(context_len, delta, config.layer_window(i))
                    for i in range(config.num_layers))
    return ExtendFlops(linear, attention)


def attention_rate(config: ModelConfig, backend: type[PagedAttentionBackend], dtype: torch.dtype,
                   *, context_len: int = 8192, delta: int = 256, page_size: int = 16,
                   repeats: int = 3) -> float:
    """FLOP/s of `backend` for one full-attention layer of `config`'s head shape: `delta`
    queries over `context_len` cached keys in shuffled pages (the long-context extend)."""
    one_layer = ModelConfig(
        architecture=config.architecture, num_layers=1, hidden_size=config.hidden_size,
        intermediate_size=8, num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim, vocab_size=32, rope_theta=10000.0, rms_norm_eps=1e-6,
        max_position_embeddings=context_len + delta, tie_word_embeddings=True)
    num_pages = -(-(context_len + delta) // page_size)
    pool = KVPool(one_layer, KVLayout(num_pages, page_size, 0), dtype)
    pool.k[0].normal_()
    pool.v[0].normal_()
    generator = torch.Generator().manual_seed(0)
    table = torch.randperm(num_pages, generator=generator)
    end = context_len + delta
    positions = torch.arange(context_len, end)
    slots = table[positions // page_size] * page_size + positions % page_size
    batch = PagedBatch([delta], [end], slots, [table])
    q = torch.randn(delta, config.num_heads, config.head_dim).to(dtype)
    k = torch.randn(delta, config.num_kv_heads, config.head_dim).to(dtype)
    spec = AttentionSpec.plain(0, config.head_dim)
    attend = backend(pool, batch)
    attend(spec, q, k, k)  # first-call costs stay out
    started = time.perf_counter()
    for _ in range(repeats):
        attend(spec, q, k, k)
    elapsed = (time.perf_counter() - started) / repeats
    return 4.0 * config.num_heads * config.head_dim * _pairs(context_len, delta, None) / elapsed
