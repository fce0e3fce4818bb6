"""Dense causal attention with no cache: the oracle every paged backend is compared with."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence. q: (T, Hq, D); k, v: (S, Hkv, D) with the last T keys aligned to the queries
    (S >= T; the first S - T keys are a prefix every query sees). Returns (T, Hq, D)."""
    t_len, s_len = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if t_len == 1:
        # A single query (decode) sees every key: no mask needed.
        out = F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
    elif t_len == s_len:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
    else:
        # Query i sits at key position (s_len - t_len + i) and sees keys up to it.
        offsets = torch.arange(t_len, device=q.device).unsqueeze(1) + (s_len - t_len)
        mask = torch.arange(s_len, device=q.device).unsqueeze(0) <= offsets
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
    return out.transpose(0, 1)


class DenseAttention:
    """Each sequence attends causally within its own rows of the batch; nothing is stored."""

    def __init__(self, seq_lens: Sequence[int]) -> None:
        self.seq_lens = list(seq_lens)

    def __call__(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        outs = []
        start = 0
        for seq_len in self.seq_lens:
            end = start + seq_len
            outs.append(causal_attention(q[start:end], k[start:end], v[start:end]))
            start = end
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
