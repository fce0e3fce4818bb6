"""Extend attention for CPU from two fused flash-attention calls merged by their log-sum-exp.

New query rows see a cached prefix (every row sees all of it) and themselves (causally). A masked
SDPA over the whole context falls back to torch's unfused math path on CPU, materialising a
(T, S) score matrix per head; splitting the two parts lets both run in the fused kernel, which
is ~8x faster at 7.5k context. `dense.causal_attention` stays the plain reference.
"""

from __future__ import annotations

import torch

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (H, T, D); k, v: (H, S, D) -> (output (H, T, D), log-sum-exp (H, T))."""
    out, lse = _flash(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), 0.0, causal)[:2]
    return out[0], lse[0]


def extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence. q: (T, Hq, D); k, v: (S, Hkv, D), S >= T, the last T keys are the queries'
    own rows. Returns (T, Hq, D), equal to `dense.causal_attention` up to float rounding."""
    t_len, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    prefix_len = k.shape[0] - t_len
    # Self block: causal and square; grouped heads expand K/V (only T rows, so it is cheap).
    self_k = k[prefix_len:].repeat_interleave(group, dim=1).transpose(0, 1)
    self_v = v[prefix_len:].repeat_interleave(group, dim=1).transpose(0, 1)
    self_out, self_lse = _attend(q.transpose(0, 1), self_k, self_v, causal=True)
    if prefix_len == 0:
        return self_out.transpose(0, 1)
    # Prefix: no mask, so each KV head's query heads fold into one (group * T) row block and the
    # long prefix K/V is never expanded.
    folded_q = q.view(t_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    folded_q = folded_q.reshape(num_kv_heads, group * t_len, head_dim)
    prefix_out, prefix_lse = _attend(
        folded_q, k[:prefix_len].transpose(0, 1), v[:prefix_len].transpose(0, 1), causal=False)
    prefix_out = prefix_out.reshape(num_heads, t_len, head_dim)
    prefix_lse = prefix_lse.reshape(num_heads, t_len)
    # out = (e^lse_p * out_p + e^lse_s * out_s) / (e^lse_p + e^lse_s)
    #     = out_s + (out_p - out_s) * sigmoid(lse_p - lse_s): three ops, stable for any lse.
    prefix_w = torch.sigmoid(prefix_lse - self_lse).unsqueeze(-1).to(self_out.dtype)
    merged = torch.lerp(self_out, prefix_out, prefix_w)
    return merged.transpose(0, 1).to(q.dtype)
