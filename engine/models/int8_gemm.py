"""Projections of extends (prefill chunks, agent-turn deltas) as int8 GEMMs with int32 sums, on
CPUs with VNNI, from the GGUF's own codes.

An extend is compute-bound, and a VNNI instruction does four times the multiply-adds of an fp32
FMA. The weights are the file's codes, unchanged (`Int8Weight.from_packed`: Q8_0 as signed
bytes, Q4_0/Q4_1/Q4_K as their 4-bit codes widened to unsigned bytes and centred on 8, each
32-weight block with its scale and offset); the activations are quantised per row and per
block of 32, dynamically, as llama.cpp does. The kernel (csrc/qgemm_i8_cpu.c) documents the
arithmetic; `reference` emulates it in torch, bit for bit, for the tests. The drift from the
fp32 weights is the activations' rounding, bounded by tests/e2e/test_int8.py; `--dtype fp32`
keeps oneDNN's fp32 extends and `--no-packed-weights` the dense reference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import ModuleType

import torch

from engine.models.quant import BLOCK, Q4, Q8, PackedWeight
from engine.native import check_buffer, load_extension, require

TILE = 16  # outputs a kernel vector: a weight's rows must be a multiple


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled extension, or None where the install could not build it."""
    return load_extension("engine.models._qgemm_i8_cpu", "Extends use fp32 projections.")


@functools.cache
def has_vnni() -> bool:
    """Whether the kernel was built with AVX512-VNNI or AVX-VNNI (its fast paths; the portable
    build gives the same bits, slowly, and serves only tests)."""
    ext = kernel()
    return ext is not None and ext.simd() in ("avx512_vnni", "avx_vnni")


@dataclass(frozen=True)
class Int8Weight:
    """W (n, k) in the kernel's layout. codes: (n/16, k/32, 512) uint8, per 16 outputs and block
    the 8 groups of 4 consecutive weights of each output (u8 codes 0..15 for Q4, s8 for Q8);
    d, m: (n/16, k/32, 16) fp32, the block's scale and its second term's weight factor (Q4: the
    offset of the centred codes, w = d*(c - 8) + m, m = the file's offset + 8d, rounded once;
    Q8: -128 * d * sum(c), for the kernel's unsigned activations)."""

    fmt: int
    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor
    shape: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        check_buffer(self.codes, "int8 codes", (torch.uint8,))
        blocks = (self.codes.shape[0], self.codes.shape[1], TILE)
        check_buffer(self.d, "int8 scales", (torch.float32,), blocks)
        check_buffer(self.m, "int8 offsets", (torch.float32,), blocks)
        object.__setattr__(self, "shape", (self.codes.shape[0] * TILE,
                                           self.codes.shape[1] * BLOCK))

    @classmethod
    def from_packed(cls, weight: PackedWeight) -> Int8Weight | None:
        """`weight`'s codes in the kernel's layout (the same values), or None when its rows are
        not a multiple of 16."""
        n, k = weight.shape
        if n % TILE:
            return None
        nb = k // BLOCK
        if weight.fmt == Q4:
            c = weight.codes
            q = torch.cat([c & 0x0F, c >> 4], dim=-1)  # (n, nb, 32) in 0..15
            assert weight.m is not None
            m = weight.m + 8.0 * weight.d
        else:
            q = weight.codes
            sums = q.view(torch.int8).to(torch.int32).sum(-1).float()
            m = weight.d * -128.0 * sums
        codes = q.reshape(n // TILE, TILE, nb, BLOCK // 4, 4).permute(0, 2, 3, 1, 4)

        def tiled(v: torch.Tensor) -> torch.Tensor:
            return v.reshape(n // TILE, TILE, nb).permute(0, 2, 1).contiguous()

        return cls(weight.fmt, codes.reshape(n // TILE, nb, BLOCK * TILE).contiguous(),
                   tiled(weight.d), tiled(m))

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + (self.d.numel() + self.m.numel()) * 4

    def code_values(self) -> torch.Tensor:
        """The integer codes (n, k/32, 32) as int32 (Q4: 0..15, Q8: -127..127); for tests."""
        n, k = self.shape
        c = self.codes.view(torch.int8) if self.fmt == Q8 else self.codes
        c = c.reshape(n // TILE, k // BLOCK, BLOCK // 4, TILE, 4).permute(0, 3, 1, 2, 4)
        return c.reshape(n, k // BLOCK, BLOCK).to(torch.int32)

    def block_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """d and m as (n, k/32); for tests."""
        n, k = self.shape
        return (self.d.permute(0, 2, 1).reshape(n, k // BLOCK),
                self.m.permute(0, 2, 1).reshape(n, k // BLOCK))


@dataclass(frozen=True)
class QuantizedRows:
    """x (rows, k) as the kernel reads it: codes (rows, k) uint8 (s8 for Q4 weights, s8 + 128
    for Q8), dx and xs2 (rows, k/32) fp32 (xs2: the block sums of x for Q4, dx for Q8), xsub
    (rows, k/32) int32 (8 * the block sums of the codes for Q4, 0 for Q8)."""

    fmt: int
    codes: torch.Tensor
    dx: torch.Tensor
    xs2: torch.Tensor
    xsub: torch.Tensor


def quantize_rows(x: torch.Tensor, fmt: int, num_threads: int | None = None) -> QuantizedRows:
    """x (rows, k) fp32 on the CPU, quantised for weights of format `fmt`."""
    ext = require(kernel(), "int8 quantize")
    x32 = x if x.dtype == torch.float32 and x.is_contiguous() else (
        x.detach().to(torch.float32).contiguous())
    num_rows, k = x32.shape
    codes = torch.empty(num_rows, k, dtype=torch.uint8)
    dx = torch.empty(num_rows, k // BLOCK, dtype=torch.float32)
    xs2 = torch.empty_like(dx)
    xsub = torch.empty(num_rows, k // BLOCK, dtype=torch.int32)
    ext.quantize(fmt, x32.data_ptr(), num_rows, k, codes.data_ptr(), dx.data_ptr(),
                 xs2.data_ptr(), xsub.data_ptr(), num_threads or torch.get_num_threads())
    return QuantizedRows(fmt, codes, dx, xs2, xsub)


def int8_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None,
                num_threads: int | None = None, *,
                add_to: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ W.T + bias` for x (rows, k) on the CPU -> fp32 (rows, n), with x quantised per row
    and block. With `add_to` (contiguous fp32 (rows, n)) the product is added into it in place
    and `add_to` is returned."""
    ext = require(kernel(), "int8 gemm")
    n, k = weight.shape
    if not (x.is_cpu and x.dim() == 2 and x.shape[1] == k):
        raise ValueError(f"int8_linear: input {list(x.shape)} on {x.device} does not fit a CPU "
                         f"weight of {[n, k]}")
    threads = num_threads or torch.get_num_threads()
    rows = quantize_rows(x, weight.fmt, threads)
    num_rows = x.shape[0]
    if add_to is not None:
        check_buffer(add_to, "int8_linear add_to", (torch.float32,), (num_rows, n))
        if bias is not None:
            raise ValueError("int8_linear: add_to takes no bias")
    out = add_to if add_to is not None else torch.empty(num_rows, n, dtype=torch.float32)
    ext.gemm(weight.fmt, rows.codes.data_ptr(), rows.dx.data_ptr(), rows.xs2.data_ptr(),
             rows.xsub.data_ptr(), num_rows, weight.codes.data_ptr(), weight.d.data_ptr(),
             weight.m.data_ptr(), n, k, out.data_ptr(), threads, add_to is not None)
    return out if bias is None else out.add_(bias)


def reference_rows(x: torch.Tensor, fmt: int) -> QuantizedRows:
    """`quantize_rows` in torch, step for step in fp32 (the same bits)."""
    num_rows, k = x.shape
    xb = x.float().reshape(num_rows, k // BLOCK, BLOCK)
    dx = xb.abs().amax(-1) / 127.0
    inv = torch.where(dx != 0, 1.0 / dx, torch.zeros_like(dx))
    xq = torch.round(xb * inv.unsqueeze(-1)).to(torch.int32)
    if fmt == Q8:
        return QuantizedRows(fmt, (xq + 128).to(torch.uint8).reshape(num_rows, k), dx, dx,
                             torch.zeros_like(dx, dtype=torch.int32))
    s = xb[..., :16] + xb[..., 16:]  # the kernel's fixed order: lanes i and i + 16, then halves
    for width in (8, 4, 2, 1):
        s = s[..., :width] + s[..., width : 2 * width]
    return QuantizedRows(fmt, xq.to(torch.int8).view(torch.uint8).reshape(num_rows, k), dx,
                         s[..., 0], 8 * xq.sum(-1, dtype=torch.int32))


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 a * b + c with one rounding: the fp32 product is exact in float64, and so is its
    sum with c unless their exponents are far apart (then rounding twice could differ)."""
    return (a.double() * b.double() + c.double()).float()


def reference(x: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
    """The kernel's arithmetic in torch, block by block with the same roundings: the same bits
    as `int8_linear` (tests hold every build of the kernel to it)."""
    rows = reference_rows(x, weight.fmt)
    num_rows, k = x.shape
    nb = k // BLOCK
    xq = rows.codes.reshape(num_rows, nb, BLOCK)
    xq = (xq.to(torch.int32) if weight.fmt == Q8 else xq.view(torch.int8).to(torch.int32))
    c = weight.code_values()
    d, m = weight.block_factors()
    y = torch.zeros(num_rows, weight.shape[0])
    for b in range(nb):
        dots = (xq[:, b].double() @ c[:, b].double().T  # exact integers
                - rows.xsub[:, b].double().unsqueeze(1)).float()
        y = _fma(dots, d[:, b].unsqueeze(0) * rows.dx[:, b].unsqueeze(1), y)
        y = _fma(m[:, b].unsqueeze(0), rows.xs2[:, b].unsqueeze(1), y)
    return y
