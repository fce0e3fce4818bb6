"""A projection's weight in each form the model holds, and the one `linear` that computes with
any of them (the torch forward and the fused CPU forward both call it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.models.ggml_weight import GgmlWeight, ggml_linear
from engine.models.onednn import OneDnnWeight, onednn_linear

# A projection's weight: a dense tensor, the GGUF file's own codes (`GgmlWeight`, every row
# count), or a dense tensor in oneDNN's layout (extends).
Weight = torch.Tensor | GgmlWeight | OneDnnWeight


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` computed in the weight's dtype (int8 rows with fp32 scales, or fp32,
    for GGUF codes), returned in `x`'s dtype."""
    if isinstance(weight, GgmlWeight):
        return ggml_linear(x, weight, bias).to(x.dtype)
    if isinstance(weight, OneDnnWeight):
        return onednn_linear(x, weight, bias)
    if weight.dtype == x.dtype:
        return F.linear(x, weight, bias)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)
