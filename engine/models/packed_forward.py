"""The CPU forward over packed weights, in few calls a layer.

`LlamaModel.forward` runs ~40 torch ops a layer. For the few rows of a decode step (or a draft
verification) each op costs more in dispatch than in arithmetic on a small CPU; for the hundreds
of rows of an extend each is a separate pass over memory. This forward does the same math in 9
calls a layer: RMSNorm, rotary and SiLU-gate in C (rowops), the projections with the residual
adds fused into the o and down projections. A projection runs on whatever form the model holds
for that row count: the GGUF's own codes (quant.qlinear, few rows), oneDNN's blocked layout
(extends), or a dense tensor. Used only on the CPU for fp32 models with packed weights
(`LlamaModel.forward`); tests/e2e/test_packed_decode.py proves it equal to the dense forward up
to rounding.

With mixed precision an extend's projections are bf16 (oneDNN's layout): their inputs and
outputs stay bf16 (the norms write bf16, rotary and the SiLU-gate run on bf16 rows, attention
gets bf16 q/k/v for the bf16 pool), so no row is cast on its own; the residual stream and the
norms' arithmetic stay fp32, as in the torch forward that casts at every projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.models import rowops
from engine.models.linear import Weight, linear
from engine.models.onednn import OneDnnWeight
from engine.models.quant import PackedWeight, qlinear

if TYPE_CHECKING:
    from engine.models.llama import AttentionFn, LayerWeights, LlamaModel


def _add_projection(residual: torch.Tensor, x: torch.Tensor, weight: Weight) -> None:
    """residual += x @ W.T, in place."""
    if isinstance(weight, PackedWeight):
        qlinear(x, weight, add_to=residual)
    else:
        residual.add_(linear(x, weight))


def _row_dtype(layer: LayerWeights) -> torch.dtype:
    """The dtype a forward on `layer`'s projections keeps its GEMM rows in."""
    weight = layer.qkv
    if isinstance(weight, OneDnnWeight):
        return weight.packed.dtype
    return torch.float32 if isinstance(weight, PackedWeight) else weight.dtype


def packed_forward(model: LlamaModel, linears: Sequence[LayerWeights], input_ids: torch.Tensor,
                   positions: torch.Tensor, attention: AttentionFn,
                   cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """input_ids, positions: int64 (N,). Returns final-normed hidden states (N, hidden) fp32."""
    cfg = model.config
    eps = cfg.rms_norm_eps
    num_tokens = input_ids.shape[0]
    positions = positions.contiguous()
    x = F.embedding(input_ids, model.weights.embed).contiguous()
    rows = _row_dtype(linears[0])
    for layer_idx, (layer, lin) in enumerate(zip(model.weights.layers, linears, strict=True)):
        qkv = linear(rowops.rms_norm(x, layer.attn_norm, eps, rows), lin.qkv, lin.qkv_bias)
        rowops.rotary_(qkv, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim, positions, cos, sin)
        q, k, v = torch.split(qkv, [cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        attn = attention(layer_idx, q.view(num_tokens, cfg.num_heads, cfg.head_dim),
                         k.view(num_tokens, cfg.num_kv_heads, cfg.head_dim),
                         v.view(num_tokens, cfg.num_kv_heads, cfg.head_dim))
        _add_projection(x, attn.reshape(num_tokens, cfg.q_size).to(rows), lin.o)
        gate_up = linear(rowops.rms_norm(x, layer.ffn_norm, eps, rows), lin.gate_up)
        _add_projection(x, rowops.silu_mul(gate_up), lin.down)
    return rowops.rms_norm(x, model.weights.norm, eps)
