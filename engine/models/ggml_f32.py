"""The fp32 path over a GGUF's quantised codes (`--dtype fp32`), in ggml's own block layout as
the memory-mapped file holds it: no dense copy of a quantised weight is kept.

Two entry points of the compiled kernel (csrc/ggml_f32.c; the contract of the three codes
kernels is docs/ggml_kernels.md):

* `dequantize_rows`: rows of W in fp32, bit for bit what gguf's dequantiser gives
  (`engine.models.kquant.dequantize_ggml`): the embedding gather (token ids -> rows of
  `token_embd`) and the dense reference.
* `matmul`: y (+)= x @ W.T in fp32, W exactly those weights. Each (row, output) sum has one order
  fixed by the build: lane l of 16 (AVX-512) or 8 (AVX2, scalar) accumulates the products of
  the k-indices i = l mod lanes in ascending i, one rounding each, then the lanes are added by a
  fixed tree. So a row's bits do not depend on the rows beside it, on how the rows are split
  into calls or on the thread count: the fp32 path is batch-invariant. Against
  dequantise-then-matmul in float64 its error is fp32 summation's (the tests' bound).

Types (ggml ids): Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14. W is n rows
of `k / block_weights * block_bytes` bytes, read in place (a read-only memory map included, any
alignment). Everything handed to C is checked here first, row ids included: C would read
wherever an id pointed.
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np
import torch

from engine.models.ggml_ref import FORMATS, GgmlFormat
from engine.native import check_buffer, load_extension, require

# Formats by ggml type id (the kernel's `type_id`).
FORMATS_BY_ID: dict[int, GgmlFormat] = {f.type_id: f for f in FORMATS.values()}


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled extension, or None where the install could not build it."""
    return load_extension("engine.models._ggml_f32",
                          "The fp32 path needs dense weights dequantised in torch.")


def simd() -> str:
    """The SIMD path the built kernel took ("avx512", "avx2", "scalar"), or "not built"."""
    ext = kernel()
    return "not built" if ext is None else str(ext.simd())


def row_bytes(type_id: int, k: int) -> int:
    """Bytes of a row of k weights of ggml type `type_id`. Raises ValueError for a type the
    kernel does not read or a k that is not a positive multiple of the type's block."""
    fmt = FORMATS_BY_ID.get(int(type_id))
    if fmt is None:
        raise ValueError(f"ggml_f32: no kernel for ggml type {int(type_id)} (supported: "
                         f"{sorted(FORMATS_BY_ID)})")
    if k <= 0 or k % fmt.block_weights:
        raise ValueError(f"ggml_f32: k = {k} is not a positive multiple of the type's "
                         f"{fmt.block_weights}-weight block")
    return k // fmt.block_weights * fmt.block_bytes


def _weight_pointer(w: torch.Tensor | np.ndarray, nbytes: int, n: int | None) -> tuple[int, int]:
    """W's data pointer and row count after checking it is (rows, nbytes) contiguous bytes on the
    CPU (rows == n where n is given). A numpy array (a read-only memory map) is read in place:
    the kernel never writes W, and torch.from_numpy would warn on it."""
    if isinstance(w, np.ndarray):
        if (w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] != nbytes
                or (n is not None and w.shape[0] != n) or not w.flags.c_contiguous):
            raise ValueError(f"ggml_f32: w must be C-contiguous uint8 "
                             f"{[n if n is not None else 'rows', nbytes]}, got {w.dtype} "
                             f"{list(w.shape)}")
        return int(w.ctypes.data), int(w.shape[0])
    if w.dim() != 2:
        raise ValueError(f"ggml_f32: w must be (rows, {nbytes}) bytes, got {list(w.shape)}")
    rows = n if n is not None else w.shape[0]
    check_buffer(w, "ggml_f32 w", (torch.uint8,), (rows, nbytes))
    return int(w.data_ptr()), int(rows)


def dequantize_rows(type_id: int, w: torch.Tensor | np.ndarray, k: int,
                    row_ids: torch.Tensor | None = None, num_threads: int | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 (len(row_ids), k): row r is W's row row_ids[r] dequantised, the bits of
    `kquant.dequantize_ggml` (gguf's dequantiser); without row_ids, every row of W. row_ids:
    int64 CPU tensor of any shape (taken flat; repeats and any order), each in [0, rows of W),
    else IndexError naming the first one out of range. W: (rows, row bytes) uint8, as
    `matmul` takes it. `out` (contiguous fp32 (len, k)) receives the rows instead of a new
    tensor. Returns the rows."""
    ext = require(kernel(), "ggml_f32.dequantize_rows")
    address, n = _weight_pointer(w, row_bytes(type_id, k), None)
    ids_address, num_rows = 0, n
    if row_ids is not None:
        ids = row_ids.reshape(-1)
        check_buffer(ids, "ggml_f32 row_ids", (torch.int64,))
        num_rows = ids.numel()
        # C reads the rows the ids name: each is checked first (one reduction, cheap beside
        # the rows they fetch).
        low, high = ids.aminmax() if num_rows else (0, 0)
        if int(low) < 0 or int(high) >= n:
            bad = int(ids[(ids < 0) | (ids >= n)][0])
            raise IndexError(f"ggml_f32.dequantize_rows: row id {bad} is out of range for a "
                             f"weight of {n} rows")
        ids_address = ids.data_ptr()
    if out is None:
        out = torch.empty(num_rows, k, dtype=torch.float32)
    else:
        check_buffer(out, "ggml_f32 out", (torch.float32,), (num_rows, k))
    if num_rows:
        ext.dequantize_rows(int(type_id), address, k, ids_address, num_rows, out.data_ptr(),
                            num_threads or torch.get_num_threads())
    return out


def _output_stride(y: torch.Tensor, rows: int, n: int, ldy: int | None) -> int:
    """The row stride of output `y` after checking it holds rows x n fp32 values at
    y[r * ldy + o]: a (rows, n) view with unit column stride (a column slice of a fused output
    too), or a contiguous 1-D run of at least (rows - 1) * ldy + n values. (As ggml_vec's.)"""
    if y.dtype != torch.float32:
        raise TypeError(f"ggml_f32.matmul: y must be torch.float32, got {y.dtype}")
    if not y.is_cpu:
        raise ValueError(f"ggml_f32.matmul: y must be on the CPU, got {y.device}")
    if y.dim() == 2:
        stride = y.stride(0) if rows > 1 else max(n, ldy or n)
        if tuple(y.shape) != (rows, n) or (n > 1 and y.stride(1) != 1) or stride < n:
            raise ValueError(f"ggml_f32.matmul: y must be a ({rows}, {n}) view with unit "
                             f"column stride, got {list(y.shape)} strides {y.stride()}")
        if ldy is not None and rows > 1 and ldy != stride:
            raise ValueError(f"ggml_f32.matmul: ldy = {ldy} is not y's row stride {stride}")
        return stride
    ldy = n if ldy is None else ldy
    if ldy < n:
        raise ValueError(f"ggml_f32.matmul: ldy = {ldy} is below n = {n}")
    if y.dim() != 1 or not y.is_contiguous() or (rows and y.numel() < (rows - 1) * ldy + n):
        raise ValueError(f"ggml_f32.matmul: y must be (rows, n) or a contiguous 1-D tensor of "
                         f"at least (rows - 1) * ldy + n = {(rows - 1) * ldy + n} values, got "
                         f"{list(y.shape)} strides {y.stride()}")
    return ldy


def matmul(type_id: int, w: torch.Tensor | np.ndarray, n: int, k: int, x: torch.Tensor,
           y: torch.Tensor, ldy: int | None = None, accumulate: bool = False,
           num_threads: int | None = None) -> torch.Tensor:
    """y[r, o] = sum_i x[r, i] * W[o, i] in fp32, for W (n, k) of ggml type `type_id` (its n
    rows of blocks, (n, row bytes) uint8) and x (rows, k) (converted to contiguous fp32 if it is
    not), written at y's flat offset r * ldy + o, or added there with `accumulate` (one fp32
    addition after the sum: a residual for free). y: a (rows, n) fp32 view with unit column
    stride (ldy its row stride: a column slice of a fused q|k|v output works), or a contiguous
    1-D fp32 tensor with ldy >= n (default n). W's weights are exactly `dequantize_rows`'s;
    each sum's order is fixed by the build (module docstring). Returns y."""
    ext = require(kernel(), "ggml_f32.matmul")
    nbytes = row_bytes(type_id, k)
    if n < 0:
        raise ValueError(f"ggml_f32.matmul: n = {n} is negative")
    if x.dim() != 2 or x.shape[1] != k or not x.is_cpu:
        raise ValueError(f"ggml_f32.matmul: x must be a (rows, {k}) CPU tensor, got "
                         f"{list(x.shape)} on {x.device}")
    x32 = x if x.dtype == torch.float32 and x.is_contiguous() else (
        x.detach().to(torch.float32).contiguous())
    rows = x32.shape[0]
    stride = _output_stride(y, rows, n, ldy)
    address, _ = _weight_pointer(w, nbytes, n)
    if rows and n:
        ext.matmul(int(type_id), address, n, k, x32.data_ptr(), rows, y.data_ptr(), stride,
                   accumulate, num_threads or torch.get_num_threads())
    return y
