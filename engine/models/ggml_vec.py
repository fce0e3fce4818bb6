"""Few-row int8 matmuls over GGUF codes: decode GEMVs and draft verification (1..16 rows
typically, any number works), straight from the file's blocks.

The compiled kernel (csrc/ggml_vec.c) does two things, both exactly as docs/ggml_kernels.md and
`engine.models.ggml_ref` define them, bit for bit on every SIMD build:

* `quantize`: fp32 activation rows -> int8 per block of 32 (for every type), with their scales,
  their blocks' sums as fp32 (the second terms') and the int16 sums per 16 (the codes'
  offsets');
* `gemv`: y = x @ W.T from those rows and W as ggml's blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
  Q4_K, Q5_K, Q6_K), memory-mapped and read-only.

A row's result does not depend on the rows beside it, on the thread count or on the build, and
equals what the many-row `_ggml_gemm` gives it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from engine.models.ggml_ref import BLOCK, FORMATS, GgmlFormat
from engine.native import check_buffer, load_extension, require

# Formats by ggml type id (the kernel's `type_id`).
FORMATS_BY_ID: dict[int, GgmlFormat] = {f.type_id: f for f in FORMATS.values()}
SUM_LEN = 16  # activations an int16 sum covers


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled extension, or None where the install could not build it."""
    return load_extension("engine.models._ggml_vec", "GGUF codes GEMVs are unavailable.")


def simd() -> str:
    """The SIMD path the built kernel took ("avx512_vnni", "avx_vnni", "avx2", "scalar"), or
    "not built"."""
    ext = kernel()
    return "not built" if ext is None else str(ext.simd())


@dataclass(frozen=True)
class QuantizedActs:
    """Activation rows as the int8 path reads them, per block of 32 (every type): xq int8
    (rows, k); dx fp32 (rows, k / 32), each block's scale; xs fp32 (rows, k / 32), each
    block's (float)(sum of xq) * dx; sums int16 (rows, k / 16), the sum of xq over each 16
    consecutive activations. Each is contiguous (the kernel's layout). `quantize` makes them;
    one built by hand has its buffers checked."""

    xq: torch.Tensor
    dx: torch.Tensor
    xs: torch.Tensor
    sums: torch.Tensor

    def __post_init__(self) -> None:
        if self.xq.dim() != 2:
            raise ValueError(f"QuantizedActs: xq must be (rows, k), got {list(self.xq.shape)}")
        rows, k = self.xq.shape
        if k % BLOCK:
            raise ValueError(f"QuantizedActs: k = {k} is not a multiple of {BLOCK}")
        check_buffer(self.xq, "QuantizedActs.xq", (torch.int8,))
        check_buffer(self.dx, "QuantizedActs.dx", (torch.float32,), (rows, k // BLOCK))
        check_buffer(self.xs, "QuantizedActs.xs", (torch.float32,), (rows, k // BLOCK))
        check_buffer(self.sums, "QuantizedActs.sums", (torch.int16,), (rows, k // SUM_LEN))

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, k)."""
        return (self.xq.shape[0], self.xq.shape[1])

    @classmethod
    def _made(cls, xq: torch.Tensor, dx: torch.Tensor, xs: torch.Tensor,
              sums: torch.Tensor) -> QuantizedActs:
        """Buffers `quantize` allocated itself, valid by construction, wrapped without the
        checks (a decode step quantises a few rows hundreds of times; the checks cost a
        microsecond each)."""
        acts = object.__new__(cls)
        for name, value in (("xq", xq), ("dx", dx), ("xs", xs), ("sums", sums)):
            object.__setattr__(acts, name, value)
        return acts


def quantize(x: torch.Tensor, num_threads: int | None = None,
             out: QuantizedActs | None = None) -> QuantizedActs:
    """x (rows, k) on the CPU, k a multiple of 32 -> its int8 rows per block of 32: dx =
    max|x| / 127, xq = round-half-even(x / dx) (0 where dx = 0), xs = (float)(sum of the
    block's xq) * dx, and the int16 sums per 16; equal to `ggml_ref.quantize_rows` bit for bit
    (for finite x; a block with a NaN gets dx and xs NaN and xq 0). Non-fp32 or non-contiguous
    x is converted first. `out`, of the same shape, is written and returned instead of new
    tensors (a decode loop's buffers)."""
    ext = require(kernel(), "ggml_vec.quantize")
    if x.dim() != 2 or not x.is_cpu:
        raise ValueError(f"ggml_vec.quantize: x must be a (rows, k) CPU tensor, got "
                         f"{list(x.shape)} on {x.device}")
    rows, k = x.shape
    if k % BLOCK or k == 0:
        raise ValueError(f"ggml_vec.quantize: k = {k} is not a positive multiple of {BLOCK}")
    x32 = x if x.dtype == torch.float32 and x.is_contiguous() else (
        x.detach().to(torch.float32).contiguous())
    if out is None:
        scales = torch.empty(2, rows, k // BLOCK)  # dx and xs, one allocation
        out = QuantizedActs._made(torch.empty(rows, k, dtype=torch.int8), scales[0], scales[1],
                                  torch.empty(rows, k // SUM_LEN, dtype=torch.int16))
    elif out.shape != (rows, k):
        raise ValueError(f"ggml_vec.quantize: out {list(out.shape)} does not fit x {[rows, k]}")
    if rows:
        ext.quantize(x32.data_ptr(), rows, k, out.xq.data_ptr(), out.dx.data_ptr(),
                     out.xs.data_ptr(), out.sums.data_ptr(),
                     num_threads or torch.get_num_threads())
    return out


def _weight_pointer(w: torch.Tensor | np.ndarray, n: int, row_bytes: int) -> int:
    """W's data pointer after checking it is (n, row_bytes) contiguous bytes on the CPU. A
    numpy array (a read-only memory map) is read in place: the kernel never writes W."""
    if isinstance(w, np.ndarray):
        if w.dtype != np.uint8 or w.shape != (n, row_bytes) or not w.flags.c_contiguous:
            raise ValueError(f"ggml_vec.gemv: w must be C-contiguous uint8 {[n, row_bytes]}, "
                             f"got {w.dtype} {list(w.shape)}")
        return int(w.ctypes.data)
    check_buffer(w, "ggml_vec.gemv w", (torch.uint8,), (n, row_bytes))
    return int(w.data_ptr())


def _output_stride(y: torch.Tensor, rows: int, n: int, ldy: int | None) -> int:
    """The row stride of output `y` after checking it holds rows x n fp32 values at
    y[r * ldy + o]: a (rows, n) view with unit column stride (a column slice of a fused output
    too), or a contiguous 1-D run of at least (rows - 1) * ldy + n values."""
    if y.dtype != torch.float32:
        raise TypeError(f"ggml_vec.gemv: y must be torch.float32, got {y.dtype}")
    if not y.is_cpu:
        raise ValueError(f"ggml_vec.gemv: y must be on the CPU, got {y.device}")
    if y.dim() == 2:
        stride = y.stride(0) if rows > 1 else max(n, ldy or n)
        if tuple(y.shape) != (rows, n) or (n > 1 and y.stride(1) != 1) or stride < n:
            raise ValueError(f"ggml_vec.gemv: y must be a ({rows}, {n}) view with unit column "
                             f"stride, got {list(y.shape)} strides {y.stride()}")
        if ldy is not None and rows > 1 and ldy != stride:
            raise ValueError(f"ggml_vec.gemv: ldy = {ldy} is not y's row stride {stride}")
        return stride
    ldy = n if ldy is None else ldy
    if ldy < n:
        raise ValueError(f"ggml_vec.gemv: ldy = {ldy} is below n = {n}")
    if y.dim() != 1 or not y.is_contiguous() or (rows and y.numel() < (rows - 1) * ldy + n):
        raise ValueError(f"ggml_vec.gemv: y must be (rows, n) or a contiguous 1-D tensor of at "
                         f"least (rows - 1) * ldy + n = {(rows - 1) * ldy + n} values, got "
                         f"{list(y.shape)} strides {y.stride()}")
    return ldy


def gemv(type_id: int, w: torch.Tensor | np.ndarray, n: int, k: int, acts: QuantizedActs,
         y: torch.Tensor, ldy: int | None = None, accumulate: bool = False,
         num_threads: int | None = None) -> torch.Tensor:
    """y[r, o] = sum_i x[r, i] * W[o, i] for W (n, k) of ggml type `type_id` and the rows x
    quantised by `quantize`, written at y's flat offset
    r * ldy + o, or added there with `accumulate` (one fp32 addition after the sum: a residual
    for free). y: a (rows, n) fp32 view with unit column stride (ldy its row stride; a column
    slice of a fused q|k|v output works), or a contiguous 1-D fp32 tensor with ldy >= n
    (default n). W: n rows of the type's blocks, (n, k / block_weights * block_bytes) uint8,
    as the GGUF memory map holds them; a read-only numpy array is read in place (the kernel
    never writes W nor assumes any alignment). Returns y. Every row's bits are
    `ggml_ref.reference_int8`'s, whatever the rows beside it, the build and `num_threads`."""
    ext = require(kernel(), "ggml_vec.gemv")
    fmt = FORMATS_BY_ID.get(type_id)
    if fmt is None:
        raise ValueError(f"ggml_vec.gemv: no kernel for ggml type {type_id} (supported: "
                         f"{sorted(FORMATS_BY_ID)})")
    if k <= 0 or k % fmt.block_weights:
        raise ValueError(f"ggml_vec.gemv: k = {k} is not a positive multiple of the type's "
                         f"{fmt.block_weights}-weight block")
    if acts.shape[1] != k:
        raise ValueError(f"ggml_vec.gemv: activations {list(acts.shape)} do not fit k = {k}")
    if n < 0:
        raise ValueError(f"ggml_vec.gemv: n = {n} is negative")
    rows = acts.shape[0]
    stride = _output_stride(y, rows, n, ldy)
    wp = _weight_pointer(w, n, k // fmt.block_weights * fmt.block_bytes)
    if rows and n:
        ext.gemv(type_id, wp, n, k, acts.xq.data_ptr(), acts.dx.data_ptr(), acts.xs.data_ptr(),
                 acts.sums.data_ptr(), rows, y.data_ptr(), stride, accumulate,
                 num_threads or torch.get_num_threads())
    return y
