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

from engine.native import check_buffer, load_extension, require


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled extension, or None where the install could not build it."""
    return load_extension("engine.models._rowops_cpu", "The model keeps its torch forward.")


def _ext() -> ModuleType:
    ext = kernel()
    return ext if ext is not None else require(ext, "engine.models.rowops")


FP32 = (torch.float32,)


def _check(t: torch.Tensor, what: str, dtypes: tuple[torch.dtype, ...] = FP32) -> None:
    # The C code reads raw memory: dtype, device and layout are checked before it does (the
    # passing case inline: a decode step makes ~300 of these calls).
    if not (t.dtype in dtypes and t.is_cpu and t.is_contiguous()):
        check_buffer(t, what, dtypes)


ROW_DTYPES = (torch.float32, torch.bfloat16)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`(x * rsqrt(mean(x^2, -1) + eps) * weight).to(out_dtype)` for fp32 x (rows, hidden): a
    new tensor, fp32 or bf16."""
    _check(x, "rms_norm input")
    _check(weight, "rms_norm weight")
    if out_dtype not in ROW_DTYPES:
        raise TypeError(f"rms_norm writes fp32 or bf16 rows, not {out_dtype}")
    if weight.shape != x.shape[-1:] or x.dim() != 2:
        raise ValueError(f"rms_norm: rows {list(x.shape)} and weight {list(weight.shape)} "
                         "do not fit")
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
    _check(qkv, "rotary rows", ROW_DTYPES)
    _check(cos, "rotary cos table")
    _check(sin, "rotary sin table")
    _check(positions, "rotary positions", (torch.int64,))
    if qkv.dim() != 2 or num_heads * head_dim > qkv.shape[1] or positions.shape != qkv.shape[:1]:
        raise ValueError(f"rotary: {num_heads} heads of {head_dim} and {positions.shape[0]} "
                         f"positions do not fit rows {list(qkv.shape)}")
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != head_dim:
        raise ValueError(f"rotary tables {list(cos.shape)}/{list(sin.shape)} do not fit "
                         f"head_dim {head_dim}")
    # A position outside the tables raises IndexError (checked in C, before any write).
    _ext().rotary(qkv.data_ptr(), qkv.dtype == torch.bfloat16, qkv.shape[1], qkv.shape[0],
                  num_heads, head_dim, cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
                  cos.shape[0])
    return qkv


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `gate_up` = [gate | up] (rows, 2 * intermediate), fp32 or bf16, in
    fp32; the result in `gate_up`'s dtype."""
    _check(gate_up, "silu_mul rows", ROW_DTYPES)
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul needs (rows, 2 * intermediate), got {list(gate_up.shape)}")
    inter = gate_up.shape[1] // 2
    out = torch.empty(gate_up.shape[0], inter, dtype=gate_up.dtype)
    _ext().silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.dtype == torch.bfloat16,
                    gate_up.shape[0], inter)
    return out
