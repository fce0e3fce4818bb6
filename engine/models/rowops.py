"""RMSNorm, rotary and SiLU-gate for decode-sized fp32 forwards, one C call each
(csrc/rowops_cpu.c): a decode step on a small CPU spends more in torch op dispatch than in
these ops' arithmetic. Each function states the torch expression it equals up to rounding
(tests/engine/models/test_rowops.py holds them to it). Without the built extension `kernel()`
is None and the model keeps its torch forward."""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from engine.native import load_extension


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled extension, or None where the install could not build it."""
    return load_extension("engine.models._rowops_cpu", "The model keeps its torch forward.")


def _ext() -> ModuleType:
    ext = kernel()
    assert ext is not None, "engine.models.rowops needs the built extension"
    return ext


def _check(t: torch.Tensor) -> None:
    # The C code reads raw fp32 memory; CUDA tensors never reach here (packed weights are CPU
    # only), so dtype and layout are what can go wrong.
    assert t.dtype is torch.float32 and t.is_contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`x * rsqrt(mean(x^2, -1) + eps) * weight` for x (rows, hidden): a new tensor."""
    _check(x)
    _check(weight)
    out = torch.empty_like(x)
    _ext().rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
    return out


def rotary_(qkv: torch.Tensor, num_heads: int, head_dim: int, positions: torch.Tensor,
            cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates the first `num_heads` heads of each row of `qkv` (rows, width) in place by its
    position ("rotate half": `x * cos[p] + cat(-x2, x1) * sin[p]` per head), cos/sin the
    (max_positions, head_dim) tables. Heads past `num_heads` (v) are left as they are."""
    _check(qkv)
    _check(cos)
    _check(sin)
    assert positions.dtype == torch.int64 and positions.is_contiguous()
    assert num_heads * head_dim <= qkv.shape[1] and positions.shape[0] == qkv.shape[0]
    assert cos.shape == sin.shape and cos.shape[1] == head_dim
    # A position outside the tables raises IndexError (checked in C, before any write).
    _ext().rotary(qkv.data_ptr(), qkv.shape[1], qkv.shape[0], num_heads, head_dim,
                  cos.data_ptr(), sin.data_ptr(), positions.data_ptr(), cos.shape[0])
    return qkv


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `gate_up` = [gate | up] (rows, 2 * intermediate)."""
    _check(gate_up)
    inter = gate_up.shape[1] // 2
    out = torch.empty(gate_up.shape[0], inter, dtype=torch.float32)
    _ext().silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.shape[0], inter)
    return out
