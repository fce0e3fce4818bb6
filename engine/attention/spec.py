"""What one layer's attention computes, beyond q, k and v: the contract between a model and
every attention backend.

A model hands each layer's `AttentionSpec` to the backend with that layer's rows, so layers of
one model may differ (Gemma 3's sliding and global layers, gpt-oss's sinks). A backend states
what it can compute with `unsupported(spec)`; the engine picks one that can run every layer of
the model (`engine.attention.registry.backend_for`), and a backend asked for by name that cannot
is refused at start, never run with a part of the math left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class AttentionSpec:
    """Softmax(scale * q k^T (+ mask)) v for one layer.

    `window`: the layer's sliding window W: the query at position p sees keys at positions j with
    p - W < j <= p (W keys counting itself; HF transformers' `sliding_window`, FlashAttention's
    window_left = W - 1). None: every earlier position (full causal).
    `sinks`: fp32 (num_heads,) logits, one per query head, that join each row's softmax
    denominator with no value (gpt-oss): out = sum_j e^s_j v_j / (sum_j e^s_j + e^sink).
    `softcap`: scores become softcap * tanh(scores / softcap) before the softmax (Gemma 2).
    """

    layer_idx: int
    scale: float
    window: int | None = None
    sinks: torch.Tensor | None = None
    softcap: float | None = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"layer {self.layer_idx}: sliding window must be >= 1, "
                             f"got {self.window}")
        if self.softcap is not None and self.softcap <= 0:
            raise ValueError(f"layer {self.layer_idx}: softcap must be > 0, got {self.softcap}")

    @classmethod
    def plain(cls, layer_idx: int, head_dim: int) -> AttentionSpec:
        """Full causal attention scaled by head_dim ** -0.5 (Llama and most models)."""
        return cls(layer_idx, head_dim ** -0.5)

    @property
    def features(self) -> frozenset[str]:
        """Which of "window", "sinks" and "softcap" this layer uses."""
        named = {"window": self.window, "sinks": self.sinks, "softcap": self.softcap}
        return frozenset(name for name, value in named.items() if value is not None)

    def to(self, device: torch.device | str) -> AttentionSpec:
        """The same spec with its sinks on `device`."""
        if self.sinks is None:
            return self
        return AttentionSpec(self.layer_idx, self.scale, self.window, self.sinks.to(device),
                             self.softcap)


def first_visible(spec: AttentionSpec, first_query_pos: int) -> int:
    """The earliest key position any query at `first_query_pos` or later can see."""
    if spec.window is None:
        return 0
    return max(0, first_query_pos - spec.window + 1)


def unsupported_features(specs: Iterable[AttentionSpec], supported: frozenset[str]) -> list[str]:
    """Sorted features the specs use that are not in `supported`."""
    used: set[str] = set()
    for spec in specs:
        used |= spec.features
    return sorted(used - supported)
