"""Mixture-of-experts MLP: route each token to its top-k experts, then run each expert once on
all of its tokens.

Tokens are sorted by expert, so an expert's rows are one contiguous block and its two
projections are one GEMM each over that block (grouped GEMMs); the Python loop is over the
experts that received tokens in this batch, never over tokens. Outputs are weighted by the
router and scattered back with one index_add per expert.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.config import MoEConfig
from engine.models.weights import MoEWeights


def route(h: torch.Tensor, w: MoEWeights, cfg: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids (N, k) int64, weights (N, k) fp32) of each token's chosen experts."""
    logits = F.linear(h.to(w.router.dtype), w.router, w.router_bias).float()
    if cfg.routing == "softmax_topk":
        weights, experts = torch.topk(torch.softmax(logits, dim=-1), cfg.top_k, dim=-1)
        if cfg.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    else:
        top, experts = torch.topk(logits, cfg.top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
    return experts, weights


def _gate(gate_up: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    """The expert's gated activation of its [gate | up] rows."""
    gate, up = gate_up.chunk(2, dim=-1)
    if cfg.activation == "silu":
        return F.silu(gate) * up
    # gpt-oss: gate clamped from above, up from both sides, (up + 1) * gate * sigmoid(alpha gate)
    gate = gate.clamp(max=cfg.swiglu_limit)
    up = up.clamp(min=-cfg.swiglu_limit, max=cfg.swiglu_limit)
    return (up + 1) * (gate * torch.sigmoid(gate * cfg.swiglu_alpha))


def moe_forward(h: torch.Tensor, w: MoEWeights, cfg: MoEConfig) -> torch.Tensor:
    """h (N, hidden) -> the weighted sum of each token's experts (N, hidden), in the experts'
    dtype. Only the experts `w` holds contribute (all of them but on a tensor-parallel rank,
    whose sum over the ranks is the whole)."""
    experts, weights = route(h, w, cfg)
    dtype = w.gate_up.dtype
    x = h.to(dtype)
    flat_experts = experts.flatten()
    order = torch.argsort(flat_experts, stable=True)
    token_of = order // cfg.top_k  # the token of each (sorted) assignment
    counts = torch.bincount(flat_experts, minlength=cfg.num_experts).tolist()
    out = torch.zeros(h.shape[0], w.down.shape[1], dtype=dtype, device=h.device)
    start = 0
    for expert, count in enumerate(counts):
        local = expert - w.first_expert
        start += count
        if count == 0 or not 0 <= local < w.gate_up.shape[0]:
            continue
        rows = token_of[start - count : start]
        picks = order[start - count : start]
        gate_up = F.linear(x[rows], w.gate_up[local],
                           None if w.gate_up_bias is None else w.gate_up_bias[local])
        y = F.linear(_gate(gate_up, cfg), w.down[local],
                     None if w.down_bias is None else w.down_bias[local])
        scale = weights.flatten()[picks].to(dtype).unsqueeze(1)
        out.index_add_(0, rows, y * scale)
    return out
