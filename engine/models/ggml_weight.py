"""A projection, embedding or lm_head kept as the GGUF file's own codes, and the one `linear`
and `embedding` that compute from them (docs/ggml_kernels.md).

`GgmlTensor` is one quantised tensor as the memory-mapped file holds it: n rows of ggml blocks,
never copied, never dequantised as a whole. `GgmlWeight` is what a layer reads: one tensor, or
several fused by rows (q | k | v, gate | up), which may be of different types (a Q4_K_M file
mixes Q4_K and Q6_K in one layer), each writing its own columns of one output. It computes on
one of two paths:

- int8 (the default): the activation rows are quantised per block of 32, once for all the
  parts, then few rows run the GEMV of `_ggml_vec` and many the GEMM of `_ggml_gemm`.
  Both give a row the same bits (the contract's fixed arithmetic), so where the line between
  them falls is a matter of speed only, and a row's output depends on nothing else in the call.
- fp32 (`--dtype fp32`): `_ggml_f32`, the exact dequantised weights times fp32 rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from types import ModuleType

import numpy as np
import torch
from gguf import GGMLQuantizationType

from engine.models.ggml_ref import FORMATS, GgmlFormat
from engine.native import check_buffer, load_extension, require

# Row counts up to which the int8 path runs the GEMV kernel rather than the GEMM (the same bits
# either way; measured where the GEMM's panel unpacking starts to pay off).
GEMV_MAX_ROWS = 8


@functools.cache
def _ext(name: str) -> ModuleType | None:
    return load_extension(f"engine.models.{name}", "GGUF codes run on the dense reference path.")


def kernels_built(int8: bool = True) -> bool:
    """Whether the extensions a path needs were built (with the package, by setup.py)."""
    names = ("_ggml_vec", "_ggml_gemm", "_ggml_f32") if int8 else ("_ggml_f32",)
    return all(_ext(n) is not None for n in names)


@dataclass(frozen=True)
class GgmlTensor:
    """One quantised GGUF tensor (n, k): `data` uint8 (n, row bytes), ggml's blocks as the file
    holds them (a view of its memory map, or a row selection of one)."""

    qtype: GGMLQuantizationType
    data: torch.Tensor
    k: int
    fmt: GgmlFormat = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.qtype not in FORMATS:
            raise ValueError(f"no codes kernel for {self.qtype.name}")
        fmt = FORMATS[self.qtype]
        object.__setattr__(self, "fmt", fmt)
        row_bytes = self.k // fmt.block_weights * fmt.block_bytes
        if (self.k % fmt.block_weights or self.data.dim() != 2
                or self.data.shape[1] != row_bytes):
            raise ValueError(f"{self.qtype.name} codes {list(self.data.shape)} do not hold rows "
                             f"of {self.k} weights")
        check_buffer(self.data, "GGUF codes", (torch.uint8,))

    @classmethod
    def from_numpy(cls, qtype: GGMLQuantizationType, data: np.ndarray) -> GgmlTensor:
        """A view of a GGUF tensor's bytes (n, row bytes), e.g. a memory map opened
        copy-on-write (a read-only map would make torch warn; nothing writes to it)."""
        fmt = FORMATS[qtype] if qtype in FORMATS else None
        if fmt is None:
            raise ValueError(f"no codes kernel for {qtype.name}")
        k = data.shape[1] // fmt.block_bytes * fmt.block_weights
        return cls(qtype, torch.from_numpy(data), k)

    @property
    def n(self) -> int:
        return int(self.data.shape[0])

    def rows(self, index: torch.Tensor) -> GgmlTensor:
        """Rows `index` in that order (a copy of their codes: llama's Q/K un-permutation, a
        tensor-parallel rank's share)."""
        return GgmlTensor(self.qtype, self.data[index].contiguous(), self.k)

    def columns(self, start: int, stop: int) -> GgmlTensor | None:
        """Weights [start, stop) of every row (a copy of their codes), or None unless both
        fall on block boundaries (a row-parallel rank's share)."""
        bw, bb = self.fmt.block_weights, self.fmt.block_bytes
        if start % bw or stop % bw:
            return None
        data = self.data[:, start // bw * bb : stop // bw * bb].contiguous()
        return GgmlTensor(self.qtype, data, stop - start)


@dataclass(frozen=True)
class GgmlWeight:
    """W (sum of the parts' n, k): the parts' rows in order. `int8` picks the path."""

    parts: tuple[GgmlTensor, ...]
    int8: bool = True
    shape: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        if not self.parts or len({p.k for p in self.parts}) != 1:
            raise ValueError("fused GGUF codes need at least one part, all of one width")
        object.__setattr__(self, "shape", (sum(p.n for p in self.parts), self.parts[0].k))

    def with_int8(self, int8: bool) -> GgmlWeight:
        return self if int8 == self.int8 else replace(self, int8=int8)

    def select_rows(self, index: torch.Tensor) -> GgmlWeight:
        """Rows `index` of W (ascending within each part, the parts in order: a column-parallel
        rank's heads of q, k and v), each part keeping its codes."""
        parts, offset, taken = [], 0, []
        for part in self.parts:
            mine = index[(index >= offset) & (index < offset + part.n)]
            if mine.numel():
                parts.append(part.rows(mine - offset))
                taken.append(mine)
            offset += part.n
        if not parts or not torch.equal(torch.cat(taken), index):
            raise ValueError("rows of fused codes must come part by part, in order")
        return GgmlWeight(tuple(parts), self.int8)

    def columns(self, start: int, stop: int) -> GgmlWeight | None:
        """Columns [start, stop) of W from the codes, or None where they do not fall on
        block boundaries."""
        parts = [p.columns(start, stop) for p in self.parts]
        if any(p is None for p in parts):
            return None
        return GgmlWeight(tuple(p for p in parts if p is not None), self.int8)

    @property
    def nbytes(self) -> int:
        return sum(p.data.numel() for p in self.parts)

    @property
    def type_names(self) -> str:
        return "+".join(dict.fromkeys(p.qtype.name for p in self.parts))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 (len(ids), k): rows `ids` dequantised, gguf's values bit for bit (the
        embedding gather)."""
        ext = require(_ext("_ggml_f32"), "GGUF row dequantisation")
        ids = ids.to(torch.int64).contiguous()
        n, k = self.shape
        out = torch.empty(ids.shape[0], k)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise IndexError(f"row ids out of range 0..{n - 1}")
        if len(self.parts) != 1:
            raise ValueError("a row gather reads one tensor, not fused ones")
        part = self.parts[0]
        ext.dequantize_rows(part.qtype.value, part.data.data_ptr(), k, ids.data_ptr(),
                            ids.shape[0], out.data_ptr(), torch.get_num_threads())
        return out

    def dense(self) -> torch.Tensor:
        """fp32 W, dequantised (the reference path and tests; never kept by a served model)."""
        return torch.cat([_dequantize(p) for p in self.parts])


def _dequantize(part: GgmlTensor) -> torch.Tensor:
    ext = require(_ext("_ggml_f32"), "GGUF row dequantisation")
    out = torch.empty(part.n, part.k)
    ext.dequantize_rows(part.qtype.value, part.data.data_ptr(), part.k, 0, part.n,
                        out.data_ptr(), torch.get_num_threads())
    return out


@dataclass(frozen=True)
class _Acts:
    """Rows quantised per block of 32 (the contract's xq, dx, xs and sums)."""

    xq: torch.Tensor
    dx: torch.Tensor
    xs: torch.Tensor
    sums: torch.Tensor

    @property
    def pointers(self) -> tuple[int, int, int, int]:
        return (self.xq.data_ptr(), self.dx.data_ptr(), self.xs.data_ptr(),
                self.sums.data_ptr())


def _quantize(vec: ModuleType, x: torch.Tensor, threads: int) -> _Acts:
    rows, k = x.shape
    blocks = torch.empty(2, rows, k // 32)
    acts = _Acts(torch.empty(rows, k, dtype=torch.int8), blocks[0], blocks[1],
                 torch.empty(rows, k // 16, dtype=torch.int16))
    vec.quantize(x.data_ptr(), rows, k, *acts.pointers, threads)
    return acts


def ggml_linear(x: torch.Tensor, weight: GgmlWeight, bias: torch.Tensor | None = None, *,
                add_to: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ W.T + bias` for x (rows, k) on the CPU -> fp32 (rows, n). With `add_to` (contiguous
    fp32 (rows, n)) the product is added into it in place and it is returned."""
    n, k = weight.shape
    if not (x.is_cpu and x.dim() == 2 and x.shape[1] == k):
        raise ValueError(f"ggml_linear: input {list(x.shape)} on {x.device} does not fit a "
                         f"weight of {[n, k]}")
    x32 = x if x.dtype == torch.float32 and x.is_contiguous() else (
        x.detach().to(torch.float32).contiguous())
    rows = x32.shape[0]
    if add_to is not None:
        check_buffer(add_to, "ggml_linear add_to", (torch.float32,), (rows, n))
        if bias is not None:
            raise ValueError("ggml_linear: add_to takes no bias")
    out = add_to if add_to is not None else torch.empty(rows, n)
    accumulate = add_to is not None
    threads = torch.get_num_threads()
    if rows == 0:
        return out
    column = 0
    if weight.int8:
        vec = require(_ext("_ggml_vec"), "the int8 GGUF path")
        matmul = vec.gemv if rows <= GEMV_MAX_ROWS else require(
            _ext("_ggml_gemm"), "the int8 GGUF path").gemm
        acts = _quantize(vec, x32, threads)  # kept alive while C reads its buffers
        for part in weight.parts:
            matmul(part.qtype.value, part.data.data_ptr(), part.n, k, *acts.pointers, rows,
                   out.data_ptr() + 4 * column, n, accumulate, threads)
            column += part.n
    else:
        f32 = require(_ext("_ggml_f32"), "the fp32 GGUF path")
        for part in weight.parts:
            f32.matmul(part.qtype.value, part.data.data_ptr(), part.n, k, x32.data_ptr(), rows,
                       out.data_ptr() + 4 * column, n, accumulate, threads)
            column += part.n
    return out if bias is None else out.add_(bias)


# An embedding or lm_head: dense, or the GGUF's codes.
Table = torch.Tensor | GgmlWeight


def embedding(ids: torch.Tensor, table: Table) -> torch.Tensor:
    """Rows `ids` of a table: fp32 for codes (gguf's values), the dense table's dtype else."""
    if isinstance(table, GgmlWeight):
        return table.rows(ids)
    return torch.nn.functional.embedding(ids, table)


def dense_table(table: Table) -> torch.Tensor:
    """The whole table dense (fp32 for codes: a copy, for training a draft head only)."""
    return table.dense() if isinstance(table, GgmlWeight) else table
