"""`y = x @ W.T` for many rows of x (prefill chunks, agent-turn deltas: 16 to thousands of rows)
on the int8 path, read straight from a GGUF tensor's blocks: the wrapper of the C extension
`engine.models._ggml_gemm` (csrc/ggml_gemm.c).

docs/ggml_kernels.md is the contract and engine/models/ggml_ref.py its reference in torch: W stays
in ggml's own block layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), as the memory map
holds it; the activations come already quantised per block of 32 for every type (xq, dx, xs
and the int16 sums per 16, as `_ggml_vec.quantize` gives them). Every row's output has the bits
of `ggml_ref.reference_int8`, whichever SIMD path the build took and whichever rows share the
call, so a row computed here equals the same row from the few-row GEMV (`_ggml_vec.gemv`).

The kernel unpacks 32 output rows of W at a time into a small buffer (the codes in the operand
layout of the int8 dot-product instructions, with their scales) and runs every row of x over
it, so each weight is decoded once a call and then serves all the rows.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from engine.models.ggml_ref import FORMATS, GgmlFormat
from engine.native import check_buffer, load_extension, require

# ggml's type id -> its format (block sizes).
_BY_ID: dict[int, GgmlFormat] = {fmt.type_id: fmt for fmt in FORMATS.values()}


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled extension, or None where the install could not build it."""
    return load_extension("engine.models._ggml_gemm",
                          "Many-row products of GGUF weights take another path.")


def ggml_format(type_id: int) -> GgmlFormat:
    """The format of ggml type `type_id`; ValueError for a type the kernels do not read."""
    fmt = _BY_ID.get(type_id)
    if fmt is None:
        names = ", ".join(f"{qtype.name} ({qtype.value})" for qtype in FORMATS)
        raise ValueError(f"ggml gemm: no int8 kernel for type {type_id}; it reads {names}")
    return fmt


def row_bytes(type_id: int, k: int) -> int:
    """Bytes of one row of k weights of type `type_id` (ValueError unless k is a whole number
    of blocks)."""
    fmt = ggml_format(type_id)
    if k <= 0 or k % fmt.block_weights:
        raise ValueError(f"ggml gemm: k = {k} is not a positive multiple of "
                         f"{fmt.block_weights}, the block of type {type_id}")
    return k // fmt.block_weights * fmt.block_bytes


def _check_out(y: torch.Tensor, rows: int, n: int, ldy: int) -> None:
    """y: fp32 on the CPU, (rows, >= n), its rows ldy apart and each row's n values contiguous
    (a whole (rows, ldy) tensor, or a column slice of one: q, k and v, of different types, fill
    the columns of one fused output)."""
    if y.dtype != torch.float32:
        raise TypeError(f"ggml gemm: y must be torch.float32, got {y.dtype}")
    if y.device.type != "cpu":
        raise ValueError(f"ggml gemm: y must be on the CPU, got {y.device}")
    if ldy < n:
        raise ValueError(f"ggml gemm: ldy = {ldy} is below n = {n}")
    if y.dim() != 2 or y.shape[0] != rows or y.shape[1] < n:
        raise ValueError(f"ggml gemm: y must be ({rows}, >= {n}), got {list(y.shape)}")
    if rows > 0 and ((y.stride(1) != 1 and n > 1) or (y.stride(0) != ldy and rows > 1)):
        raise ValueError(f"ggml gemm: y's strides {y.stride()} are not ({ldy}, 1)")


def gemm(type_id: int, w: torch.Tensor, n: int, k: int, xq: torch.Tensor, dx: torch.Tensor,
         xs: torch.Tensor, sums: torch.Tensor, rows: int, y: torch.Tensor, ldy: int,
         accumulate: bool = False, num_threads: int | None = None) -> torch.Tensor:
    """y[r, :n] = (x @ W.T)[r] for the `rows` quantised rows of x, or y[r, :n] += it with
    `accumulate` (the add comes after the whole sum: a residual added in place). Returns y.

    type_id: ggml's GGMLQuantizationType value. w: uint8 (n, row_bytes(type_id, k)), ggml's
    blocks, contiguous (a view of a read-only memory map is fine: it is only read). The rows
    quantised per block of 32 activations (docs/ggml_kernels.md): xq int8 (rows, k),
    |xq| <= 127; dx fp32 (rows, k / 32), each block's scale; xs fp32 (rows, k / 32), each
    block's (float)(sum of its xq) * dx; sums int16 (rows, k / 16), the sums of xq over each 16;
    all contiguous. y: fp32 (rows, >= n) with strides (ldy, 1). Raises ValueError (TypeError
    for a wrong dtype) before any pointer reaches C."""
    ext = require(kernel(), "ggml gemm")
    if n < 0 or rows < 0:
        raise ValueError(f"ggml gemm: negative size n = {n}, rows = {rows}")
    check_buffer(w, "ggml gemm weight w", (torch.uint8,), (n, row_bytes(type_id, k)))
    check_buffer(xq, "ggml gemm activations xq", (torch.int8,), (rows, k))
    check_buffer(dx, "ggml gemm activation scales dx", (torch.float32,), (rows, k // 32))
    check_buffer(xs, "ggml gemm activation block sums xs", (torch.float32,), (rows, k // 32))
    check_buffer(sums, "ggml gemm activation sums", (torch.int16,), (rows, k // 16))
    _check_out(y, rows, n, ldy)
    threads = num_threads or torch.get_num_threads()
    # The kernel walks raw pointers: every buffer was checked above, y's extent by its view.
    ext.gemm(type_id, w.data_ptr(), n, k, xq.data_ptr(), dx.data_ptr(), xs.data_ptr(),
             sums.data_ptr(), rows, y.data_ptr(), ldy, bool(accumulate), threads)
    return y
