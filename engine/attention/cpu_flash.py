"""Extend attention for CPU from fused flash-attention calls.

New query rows see a cached prefix (every row sees all of it) and themselves (causally). A masked
SDPA over the whole context falls back to torch's unfused math path on CPU, materialising a
(T, S) score matrix per head; splitting the two parts lets both run in the fused kernel, which
is ~8x faster at 7.5k context. A sliding-window layer attends only the keys its rows can see
(the last window before the first row, and the rows themselves) in one flash call under an
additive mask. Sinks rescale the output by the share of the softmax they leave to the scores.
`dense.causal_attention` stays the plain reference.
"""

from __future__ import annotations

import torch

from engine.attention.dense import causal_attention, visible_mask
from engine.attention.spec import AttentionSpec, first_visible

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

# What the flash path computes itself; anything else goes to the reference math.
FLASH_FEATURES = frozenset({"window", "sinks"})


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (H, T, D); k, v: (H, S, D) -> (output (H, T, D), log-sum-exp (H, T) fp32)."""
    out, lse = _flash(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), 0.0, causal,
                      attn_mask=mask, scale=scale)[:2]
    return out[0], lse[0]


def _expand(x: torch.Tensor, group: int) -> torch.Tensor:
    """(S, Hkv, D) -> (Hq, S, D), each KV head repeated for its query heads."""
    return x.repeat_interleave(group, dim=1).transpose(0, 1)


def extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     spec: AttentionSpec | None = None) -> torch.Tensor:
    """One sequence. q: (T, Hq, D); k, v: (S, Hkv, D), S >= T, the last T keys are the queries'
    own rows. Returns (T, Hq, D), equal to `dense.causal_attention` up to float rounding."""
    t_len, num_heads, head_dim = q.shape
    if spec is not None and not spec.features <= FLASH_FEATURES:
        return causal_attention(q, k, v, spec)
    scale = spec.scale if spec is not None else head_dim ** -0.5
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    prefix_len = k.shape[0] - t_len
    window = spec.window if spec is not None else None
    if window is not None and window < k.shape[0]:
        # Only keys some row can see; every row sees itself, so no row is fully masked (the
        # flash kernel returns lse 0, not -inf, for one).
        lo = first_visible(spec, prefix_len)  # type: ignore[arg-type]
        keep = visible_mask(t_len, k.shape[0], window, q.device)[:, lo:]
        mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device)
        mask.masked_fill_(~keep, float("-inf"))
        out, lse = _attend(q.transpose(0, 1), _expand(k[lo:], group), _expand(v[lo:], group),
                           False, scale, mask.view(1, 1, *mask.shape))
        return _sink(out, lse, spec).transpose(0, 1).to(q.dtype)
    # Self block: causal and square; grouped heads expand K/V (only T rows, so it is cheap).
    self_out, self_lse = _attend(q.transpose(0, 1), _expand(k[prefix_len:], group),
                                 _expand(v[prefix_len:], group), True, scale)
    if prefix_len == 0:
        return _sink(self_out, self_lse, spec).transpose(0, 1).to(q.dtype)
    # Prefix: no mask, so each KV head's query heads fold into one (group * T) row block and the
    # long prefix K/V is never expanded.
    folded_q = q.view(t_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    folded_q = folded_q.reshape(num_kv_heads, group * t_len, head_dim)
    prefix_out, prefix_lse = _attend(folded_q, k[:prefix_len].transpose(0, 1),
                                     v[:prefix_len].transpose(0, 1), False, scale)
    prefix_out = prefix_out.reshape(num_heads, t_len, head_dim)
    prefix_lse = prefix_lse.reshape(num_heads, t_len)
    # out = (e^lse_p * out_p + e^lse_s * out_s) / (e^lse_p + e^lse_s)
    #     = out_s + (out_p - out_s) * sigmoid(lse_p - lse_s): three ops, stable for any lse.
    prefix_w = torch.sigmoid(prefix_lse - self_lse).unsqueeze(-1).to(self_out.dtype)
    merged = torch.lerp(self_out, prefix_out, prefix_w)
    if spec is not None and spec.sinks is not None:
        lse = torch.logaddexp(prefix_lse, self_lse)
        merged = _sink(merged, lse, spec)
    return merged.transpose(0, 1).to(q.dtype)


def _sink(out: torch.Tensor, lse: torch.Tensor, spec: AttentionSpec | None) -> torch.Tensor:
    """out (H, T, D) of a softmax whose log-sum-exp is lse (H, T), with the spec's sink logit
    per head joining the denominator: out * e^lse / (e^lse + e^sink) = out * sigmoid(lse - sink).
    """
    if spec is None or spec.sinks is None:
        return out
    share = torch.sigmoid(lse - spec.sinks.float().view(-1, 1)).unsqueeze(-1)
    return out * share.to(out.dtype)
