"""The elementwise and normalising steps of a decoder layer, behind one interface with two
implementations: `TorchOps` (torch ops, any device and dtype: the reference) and `CpuOps` (one C
call each where engine.models.rowops has a kernel, for the CPU forwards over packed weights,
whose per-op dispatch cost dominates decode steps). A family's layer is written once over `Ops`
(engine.models.decoder); tests/engine/models hold the two implementations to each other.

Rows a projection reads are in the projection's dtype (bf16 for mixed precision's extends) and
the residual stream in the model's; each op computes in fp32 and rounds once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.models import rowops
from engine.models.ggml_weight import GgmlWeight, ggml_linear
from engine.models.linear import Weight, linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim, in fp32 whatever the dtypes, as
    the reference implementations compute it; the result in `out_dtype` (default x's)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(out_dtype or x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (N, heads, head_dim); cos/sin: (N, 1, head_dim), "rotate half" layout."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _heads(qkv: torch.Tensor, first: int, count: int, head_dim: int) -> torch.Tensor:
    """(N, count, head_dim) view of heads [first, first + count) of fused rows."""
    return qkv[:, first * head_dim : (first + count) * head_dim].view(-1, count, head_dim)


class TorchOps:
    """The reference implementation: plain torch, any device, any dtype."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype) -> torch.Tensor:
        """A new (rows, hidden) tensor in `out_dtype`."""
        return rms_norm(x, weight, eps, out_dtype)

    def head_norm_(self, qkv: torch.Tensor, weight: torch.Tensor, first: int, count: int,
                   head_dim: int, eps: float) -> None:
        """RMSNorm over each of heads [first, first + count) of `qkv` (rows, width), in place
        (Qwen3's and Gemma 3's q/k norms)."""
        heads = _heads(qkv, first, count, head_dim)
        heads.copy_(rms_norm(heads, weight, eps))

    def rotary_(self, qkv: torch.Tensor, num_heads: int, head_dim: int, positions: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotates the first `num_heads` heads of each row by its position, in place, computed
        in fp32 from the fp32 (max_positions, head_dim) tables."""
        heads = _heads(qkv, 0, num_heads, head_dim)
        c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        heads.copy_(apply_rotary(heads.float(), c, s))

    def gate_mul(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        """act(gate) * up for `gate_up` = [gate | up] rows, in fp32, in gate_up's dtype."""
        gate, up = gate_up.float().chunk(2, dim=-1)
        act = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")
        return (act * up).to(gate_up.dtype)

    def add_linear_(self, residual: torch.Tensor, x: torch.Tensor, weight: Weight,
                    bias: torch.Tensor | None = None) -> None:
        """residual += x @ W.T + bias, in place."""
        residual.add_(linear(x, weight, bias))


class CpuOps(TorchOps):
    """C row ops (engine.models.rowops) where a kernel exists for the call's dtypes; the torch
    ops otherwise. Only for CPU tensors, and only where `rowops.kernel()` is built."""

    name = "cpu"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype) -> torch.Tensor:
        if not (x.dtype is torch.float32 and weight.dtype is torch.float32
                and out_dtype in rowops.ROW_DTYPES and x.is_contiguous()):
            return super().rms_norm(x, weight, eps, out_dtype)
        return rowops.rms_norm(x, weight, eps, out_dtype)

    def rotary_(self, qkv: torch.Tensor, num_heads: int, head_dim: int, positions: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> None:
        if qkv.dtype not in rowops.ROW_DTYPES or not qkv.is_contiguous():
            super().rotary_(qkv, num_heads, head_dim, positions, cos, sin)
            return
        rowops.rotary_(qkv, num_heads, head_dim, positions.contiguous(), cos, sin)

    def gate_mul(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        if activation != "silu" or gate_up.dtype not in rowops.ROW_DTYPES:
            return super().gate_mul(gate_up, activation)
        return rowops.silu_mul(gate_up.contiguous())

    def add_linear_(self, residual: torch.Tensor, x: torch.Tensor, weight: Weight,
                    bias: torch.Tensor | None = None) -> None:
        # The codes kernel adds into the residual itself: no product tensor, no extra pass.
        if (bias is None and residual.dtype == torch.float32 and residual.is_contiguous()):
            if isinstance(weight, GgmlWeight):
                ggml_linear(x, weight, add_to=residual)
                return
        super().add_linear_(residual, x, weight, bias)


TORCH_OPS = TorchOps()
CPU_OPS = CpuOps()
