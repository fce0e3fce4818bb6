"""Dense fp32 or bf16 weights in oneDNN's blocked layout, for the CPU GEMMs of extends (prefill
chunks).

`F.linear` hands a plain (n, k) weight to the BLAS, which repacks it into its own panels on
every call. Reordering each weight once, at load, into the layout oneDNN's GEMM reads
(`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU backend does) and calling
oneDNN's linear on it ran the four projections of a 256-row extend 1.15-1.27x faster on 2
AVX2 cores. bf16 weights (mixed precision's extends) gain more: AMX reads its own tiled layout,
and the four projections of a 264-row extend ran 1.4x faster packed than through `F.linear`
(2 AMX cores). The values are the dense weights; results differ in summation order only
(tests/engine/models/test_onednn.py).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

# The row count the layout is chosen for: a typical prefill chunk or agent-turn delta.
BATCH_HINT = 256


@functools.cache
def available() -> bool:
    """Whether this torch has oneDNN with the reorder and linear ops (CPU builds do)."""
    ops = torch.ops.mkldnn
    try:
        return (bool(torch._C._has_mkldnn) and hasattr(ops, "_reorder_linear_weight")
                and hasattr(ops, "_linear_pointwise"))
    except RuntimeError:  # an op namespace that is not registered
        return False


@functools.cache
def packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and multiplies `dtype` weights here: fp32 wherever it is
    available; bf16 only where the CPU (or ONEDNN_MAX_CPU_ISA) has bf16 conversions
    (AVX512BW/VL/DQ or AVX-NE-CONVERT), so not on an AVX2 CPU such as Zen 3. Probed once."""
    if not available():
        return False
    if dtype == torch.float32:
        return True
    try:
        OneDnnWeight.pack(torch.zeros(16, 16, dtype=dtype))
    except RuntimeError:
        return False
    return True


@dataclass(frozen=True)
class OneDnnWeight:
    """W (n, k) fp32 or bf16 in oneDNN's layout; `shape` is the logical (n, k)."""

    packed: torch.Tensor
    shape: tuple[int, int]

    @classmethod
    def pack(cls, weight: torch.Tensor) -> OneDnnWeight:
        if weight.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"oneDNN packs fp32 or bf16 weights, not {weight.dtype}")
        if weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"oneDNN packs 2-D CPU weights, got {list(weight.shape)} on "
                             f"{weight.device}")
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(),
                                                         batch_size=BATCH_HINT)
        return cls(packed, (weight.shape[0], weight.shape[1]))


def onednn_linear(x: torch.Tensor, weight: OneDnnWeight,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ W.T + bias` for x (rows, k) -> (rows, n) in x's dtype, computed in W's (x and bias
    are cast to it)."""
    dtype = weight.packed.dtype
    if bias is not None and bias.dtype != dtype:
        bias = bias.to(dtype)
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x.to(dtype).contiguous(),
                                                           weight.packed, bias, "none", [], "")
    return out.to(x.dtype)
