"""Dense causal attention with no cache: the oracle every paged backend is compared with."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from engine.attention.spec import AttentionSpec


def visible_mask(t_len: int, s_len: int, window: int | None,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """(T, S) bool: query i (at key position S - T + i) sees key j. Causal, and within the
    sliding window when `window` is set (j > position - window)."""
    positions = torch.arange(t_len, device=device).unsqueeze(1) + (s_len - t_len)
    keys = torch.arange(s_len, device=device).unsqueeze(0)
    mask = keys <= positions
    if window is not None:
        mask &= keys > positions - window
    return mask


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     spec: AttentionSpec | None = None) -> torch.Tensor:
    """One sequence. q: (T, Hq, D); k, v: (S, Hkv, D) with the last T keys aligned to the queries
    (S >= T; the first S - T keys are a prefix every query sees, up to its window). Returns
    (T, Hq, D). `spec` None is plain causal attention scaled by D ** -0.5."""
    if spec is not None and spec.features:
        return _masked_math(q, k, v, spec)
    scale = spec.scale if spec is not None else None
    t_len, s_len = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if t_len == 1:
        # A single query (decode) sees every key: no mask needed.
        out = F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True, scale=scale)
    elif t_len == s_len:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True,
                                             scale=scale)
    else:
        mask = visible_mask(t_len, s_len, None, q.device)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True,
                                             scale=scale)
    return out.transpose(0, 1)


def _masked_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 spec: AttentionSpec) -> torch.Tensor:
    """`masked_attention` under the causal (and window) mask."""
    mask = visible_mask(q.shape[0], k.shape[0], spec.window, q.device)
    return masked_attention(q, k, v, spec, mask)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
                     mask: torch.Tensor) -> torch.Tensor:
    """Every feature of `spec` but its window, under an explicit `mask` ((T, S) bool on q's
    device, True: query i sees key j; every row must see some key), written out in fp32 as HF
    transformers' eager attention does: scores, softcap, mask, sinks as an extra softmax column
    dropped after. q: (T, Hq, D); k, v: (S, Hkv, D) -> (T, Hq, D) in q's dtype."""
    t_len, num_heads, _ = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    qh = q.transpose(0, 1).float()
    kh = k.transpose(0, 1).float().repeat_interleave(group, dim=0)
    vh = v.transpose(0, 1).float().repeat_interleave(group, dim=0)
    scores = torch.matmul(qh, kh.transpose(1, 2)) * spec.scale
    if spec.softcap is not None:
        scores = torch.tanh(scores / spec.softcap) * spec.softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if spec.sinks is not None:
        sinks = spec.sinks.float().view(num_heads, 1, 1).expand(num_heads, t_len, 1)
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, vh).transpose(0, 1).to(q.dtype)


class DenseAttention:
    """Each sequence attends causally within its own rows of the batch; nothing is stored."""

    def __init__(self, seq_lens: Sequence[int]) -> None:
        self.seq_lens = list(seq_lens)

    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        outs = []
        start = 0
        for seq_len in self.seq_lens:
            end = start + seq_len
            outs.append(causal_attention(q[start:end], k[start:end], v[start:end], spec))
            start = end
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
