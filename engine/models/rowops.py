"""RMSNorm, rotary and SiLU-gate for CPU forwards, one C call each (csrc/rowops_cpu.c): a
decode step on a small CPU spends more in torch op dispatch than in these ops' arithmetic, and
an extend pays a pass over memory per torch op. Each function states the torch expression it
equals up to rounding (tests/engine/models/test_rowops.py holds them to it). Rows are fp32, or
bf16 where a mixed-precision extend feeds bf16 GEMMs (computed in fp32, rounded once). Without
the built extension `kernel()` is None and the model keeps its torch forward.
"""

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


def _check(t: torch.Tensor, *dtypes: torch.dtype) -> None:
    # The C code reads raw memory; CUDA tensors never reach here (packed weights are CPU only),
    # so dtype and layout are what can go wrong.
    assert t.dtype in (dtypes or (torch.float32,)) and t.is_contiguous(), (t.dtype, t.stride())


ROW_DTYPES = (torch.float32, torch.bfloat16)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`(x * rsqrt(mean(x^2, -1) + eps) * weight).to(out_dtype)` for fp32 x (rows, hidden): a
    new tensor, fp32 or bf16."""
    _check(x)
    _check(weight)
    assert out_dtype in ROW_DTYPES, out_dtype
    out = torch.empty(x.shape, dtype=out_dtype)
    _ext().rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(),
                    out_dtype == torch.bfloat16, x.shape[0], x.shape[1], eps)
    return out


def rotary_(qkv: torch.Tensor, num_heads: int, head_dim: int, positions: torch.Tensor,
            cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates the first `num_heads` heads of each row of `qkv` (rows, width), fp32 or bf16, in
    place by its position ("rotate half": `x * cos[p] + cat(-x2, x1) * sin[p]` per head, in
    fp32), cos/sin the fp32 (max_positions, head_dim) tables. Heads past `num_heads` (v) are
    left as they are."""
    _check(qkv, *ROW_DTYPES)
    _check(cos)
    _check(sin)
    assert positions.dtype == torch.int64 and positions.is_contiguous()
    assert num_heads * head_dim <= qkv.shape[1] and positions.shape[0] == qkv.shape[0]
    assert cos.shape == sin.shape and cos.shape[1] == head_dim
    # A position outside the tables raises IndexError (checked in C, before any write).
    _ext().rotary(qkv.data_ptr(), qkv.dtype == torch.bfloat16, qkv.shape[1], qkv.shape[0],
                  num_heads, head_dim, cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
                  cos.shape[0])
    return qkv


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `gate_up` = [gate | up] (rows, 2 * intermediate), fp32 or bf16, in
    fp32; the result in `gate_up`'s dtype."""
    _check(gate_up, *ROW_DTYPES)
    inter = gate_up.shape[1] // 2
    out = torch.empty(gate_up.shape[0], inter, dtype=gate_up.dtype)
    _ext().silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.dtype == torch.bfloat16,
                    gate_up.shape[0], inter)
    return out
