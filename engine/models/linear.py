"""A projection's weight in each form the model holds, and the one `linear` that computes with
any of them (the torch forward and the fused CPU forward both call it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.models.int8_gemm import Int8Weight, int8_linear
from engine.models.onednn import OneDnnWeight, onednn_linear
from engine.models.quant import PackedWeight, qlinear

# A projection's weight: a dense tensor, the GGUF's own quantised codes (few-row forwards), a
# dense tensor in oneDNN's layout or the codes as int8 GEMM blocks (extends).
Weight = torch.Tensor | PackedWeight | OneDnnWeight | Int8Weight


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` computed in the weight's dtype (fp32 for packed codes, int8 with
    fp32 scales for int8 blocks), returned in `x`'s dtype."""
    if isinstance(weight, PackedWeight):
        return qlinear(x, weight, bias).to(x.dtype)
    if isinstance(weight, Int8Weight):
        return int8_linear(x, weight, bias).to(x.dtype)
    if isinstance(weight, OneDnnWeight):
        return onednn_linear(x, weight, bias)
    if weight.dtype == x.dtype:
        return F.linear(x, weight, bias)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)
