"""Linear layers over the GGUF file's own quantised weights, for forwards of few rows.

A decode step reads every weight to produce one row per sequence, so on a CPU its time is the
weight bytes it reads: 4.5-8.5 bits a weight as the GGUF stores them, 32 as the fp32 tensors
dequantised from them. `PackedWeight` keeps the file's codes and scales (repacked, not
requantised: Q4_0, Q4_1 and Q4_K become one 4-bit form with fp32 scale and offset, Q8_0 and
Q5_0 an 8-bit form), and `qlinear` computes `x @ W.T` from them in fp32 in a C/OpenMP kernel
(csrc/qlinear_cpu.c). The weights are the very values the fp32 path uses, so the two paths
differ only in summation order; tests/engine/models/test_quant.py holds them to that.

The kernel is built by pip with the package (setup.py); without it `kernel()` is None and the
model keeps its fp32 path (the loader says so). `dequantize_ggml` (engine.models.kquant, re-exported
here) gives that fp32 path's weights for every GGUF type.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import torch
from gguf import GGMLQuantizationType

from engine.models.kquant import dequantize_ggml as dequantize_ggml  # re-exported
from engine.models.kquant import q4_k_parts
from engine.native import check_buffer, load_extension, require

BLOCK = 32  # weights a block, in every supported format
Q4, Q8 = 4, 8  # the kernel's format ids
# ggml type -> (bytes a block, kernel format, offset of the codes in the block)
GGML_FORMATS = {
    GGMLQuantizationType.Q4_0: (18, Q4, 2),
    GGMLQuantizationType.Q4_1: (20, Q4, 4),
    GGMLQuantizationType.Q8_0: (34, Q8, 2),
}
Q4_K_BYTES = 144  # a Q4_K super-block: 256 weights, eight 32-weight sub-blocks
# Q5_0 (w = d * (q - 16), q 5 bits: 4 in nibbles, the fifth in a 32-bit mask) becomes the 8-bit
# form with codes q - 16, exactly: what llama-quantize writes for K-quant rows that are not a
# multiple of 256 (Gemma-3-270M's q, k, v, gate and up).
Q5_0_BYTES = 22
# Q5_1 (w = d*q + m, q 5 bits: too wide for the 4-bit form, and the 8-bit form has no offset),
# Q5_K and Q6_K stay dense (pack_ggml gives None): none fits the kernel's forms exactly.
# Q5_K's w = d*sc*q - dmin*m has 5-bit codes, and the fifth bit varies weight by weight, so
# the 4-bit form (nibble codes, one offset a block) cannot hold it; the 8-bit form has no
# offset, and d*sc*q - dmin*m is d' * integer only when dmin*m / (d*sc) is an integer. Q6_K's
# w = d*sc*(q - 32) takes its int8 scale sc per 16 weights, so a 32-weight block of the 8-bit
# form would need codes sc*(q - 32), up to 127 * 32 in magnitude: no int8. Either needs a new
# kernel format.


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled extension, or None where the install could not build it."""
    return load_extension("engine.models._qlinear_cpu", "Decode uses the dense fp32 weights.")


@dataclass(frozen=True)
class PackedWeight:
    """W (n, k) as codes and scales. Q4: codes (n, k/32, 16) uint8 (weight j of a block in the
    low nibble of byte j, weight j + 16 in the high one), w = d * q + m; Q8: codes (n, k/32, 32)
    int8 stored as uint8, w = d * q. d, m: (n, k/32) fp32 (m None for Q8)."""

    fmt: int
    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None
    # (n, k) and the buffers' addresses, fixed at construction: a decode step calls the kernel
    # 120 times, and recomputing them cost more than some of the calls.
    shape: tuple[int, int] = field(init=False)
    pointers: tuple[int, int, int] = field(init=False)

    def __post_init__(self) -> None:
        check_buffer(self.codes, "packed codes", (torch.uint8,))
        blocks = (self.codes.shape[0], self.codes.shape[1])
        check_buffer(self.d, "packed scales", (torch.float32,), blocks)
        if self.m is not None:
            check_buffer(self.m, "packed offsets", (torch.float32,), blocks)
        object.__setattr__(self, "shape", (self.codes.shape[0], self.codes.shape[1] * BLOCK))
        object.__setattr__(self, "pointers", (self.codes.data_ptr(), self.d.data_ptr(),
                                              self.m.data_ptr() if self.m is not None else 0))

    def __reduce__(self) -> tuple[type[PackedWeight], tuple[object, ...]]:
        # Pickled (to a tensor-parallel rank, engine.tp) as its buffers: the addresses are
        # recomputed where it is rebuilt, never carried over.
        return PackedWeight, (self.fmt, self.codes, self.d, self.m)

    @property
    def nbytes(self) -> int:
        m_bytes = self.m.numel() * 4 if self.m is not None else 0
        return self.codes.numel() + self.d.numel() * 4 + m_bytes

    def rows(self, index: torch.Tensor) -> PackedWeight:
        """The rows `index` of W, in that order (a permutation or a selection)."""
        return PackedWeight(self.fmt, self.codes[index].contiguous(), self.d[index].contiguous(),
                            None if self.m is None else self.m[index].contiguous())

    def dequantize(self) -> torch.Tensor:
        """W as fp32 (n, k), the same values the GGUF dequantiser gives; for tests."""
        c = self.codes.to(torch.int32)
        if self.fmt == Q4:
            q = torch.cat([c & 0x0F, c >> 4], dim=-1).float()
        else:
            q = self.codes.view(torch.int8).float()
        w = q * self.d.unsqueeze(-1)
        if self.m is not None:
            w = w + self.m.unsqueeze(-1)
        return w.reshape(self.shape)


def concat(parts: list[PackedWeight]) -> PackedWeight | None:
    """The row-wise concatenation of weights of one format (None when the formats differ)."""
    if len({p.fmt for p in parts}) != 1:
        return None
    offsets = [p.m for p in parts if p.m is not None]
    m = torch.cat(offsets) if len(offsets) == len(parts) else None
    return PackedWeight(parts[0].fmt, torch.cat([p.codes for p in parts]),
                        torch.cat([p.d for p in parts]), m)


def pack_ggml(tensor_type: GGMLQuantizationType, data: np.ndarray) -> PackedWeight | None:
    """A GGUF tensor's raw blocks (n rows of bytes, e.g. `data[e]` of a stacked (E, n, bytes)
    expert tensor) repacked, with `dequantize()` equal to gguf's dequantiser (bit for bit, but
    that Q4_0's zeros are all +0 where gguf gives -0 for d < 0); None for a type the kernel does
    not read (F32, F16, Q5_1, Q5_K, Q6_K, ...: the fp32 path serves those) and for arrays of other
    than two axes (a stacked tensor is packed expert by expert)."""
    if data.ndim != 2:
        return None
    if tensor_type == GGMLQuantizationType.Q4_K:
        return _pack_q4_k(data)
    if tensor_type == GGMLQuantizationType.Q5_0:
        return _pack_q5_0(data)
    if tensor_type not in GGML_FORMATS:
        return None
    block_bytes, fmt, code_at = GGML_FORMATS[tensor_type]
    n = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(n, -1, block_bytes)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = None
    if tensor_type == GGMLQuantizationType.Q4_1:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    elif tensor_type == GGMLQuantizationType.Q4_0:
        m = d * np.float32(-8.0)  # d * (q - 8) = d * q + (-8 d), exact in fp32
    codes = np.ascontiguousarray(blocks[..., code_at:])
    return PackedWeight(fmt, torch.from_numpy(codes), torch.from_numpy(d),
                        None if m is None else torch.from_numpy(np.ascontiguousarray(m)))


def _pack_q4_k(data: np.ndarray) -> PackedWeight:
    """Q4_K as the 4-bit form, each 32-weight sub-block one kernel block, exactly: gguf computes
    (d * sc) * q - (dmin * m) in fp32, and we store d' = d * sc and m' = -(dmin * m) (the same
    two fp32 products, each exact anyway: 11 significant bits of f16 times 6 of sc or m), so
    PackedWeight.dequantize's d' * q + m' rounds the same d' * q (exact: 17 bits times 4) and
    adds the same offset with its sign flipped, which IEEE defines as the subtraction: the same
    bits, and the kernel sums the same weights' terms in another order. The codes move from
    ggml's order (sub-block 2i in the low nibbles of bytes 32i..32i+31, 2i+1 in their high
    nibbles) to the kernel's (weight j of a block in the low nibble of byte j, weight j + 16 in
    the high one)."""
    n = data.shape[0]
    blocks = torch.from_numpy(np.array(data).view(np.uint8).reshape(-1, Q4_K_BYTES))  # a copy
    scale, offset, q = q4_k_parts(blocks)  # (blocks, 8), (blocks, 8), (blocks, 8, 32)
    codes = (q[..., :16] | (q[..., 16:] << 4)).reshape(n, -1, BLOCK // 2)
    return PackedWeight(Q4, codes.contiguous(), scale.reshape(n, -1).contiguous(),
                        offset.neg().reshape(n, -1).contiguous())


def _pack_q5_0(data: np.ndarray) -> PackedWeight:
    """Q5_0 as the 8-bit form: codes q - 16 in -16..15 and the block's scale, so
    `PackedWeight.dequantize`'s q * d is gguf's d * (q - 16), the same product. Weight j of a
    block has its low 4 bits in the low nibble of byte j of `qs` (j < 16) or the high nibble
    of byte j - 16, and its fifth in bit j of the little-endian mask `qh`."""
    n = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(n, -1, Q5_0_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    qh = blocks[..., 2:6].copy().view("<u4")  # (n, nb, 1)
    qs = blocks[..., 6:]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # (n, nb, 32)
    high = (qh >> np.arange(BLOCK, dtype=np.uint32)) & 1
    codes = (low.astype(np.int16) | (high.astype(np.int16) << 4)) - 16
    return PackedWeight(Q8, torch.from_numpy(codes.astype(np.int8).view(np.uint8)),
                        torch.from_numpy(np.ascontiguousarray(d)), None)


def qlinear(x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None,
            num_threads: int | None = None, *, add_to: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ W.T + bias` for x (rows, k) on the CPU -> fp32 (rows, n). With `add_to` (a
    contiguous fp32 (rows, n) tensor) the product is added into it in place (a residual
    connection with no extra pass), and `add_to` is returned."""
    ext = kernel()
    if ext is None:
        ext = require(ext, "qlinear")  # raises
    n, k = weight.shape
    if not (x.is_cpu and x.dim() == 2 and x.shape[1] == k):
        raise ValueError(f"qlinear: input {list(x.shape)} on {x.device} does not fit a CPU "
                         f"weight of {[n, k]}")
    x32 = x if x.dtype == torch.float32 and x.is_contiguous() else (
        x.detach().to(torch.float32).contiguous())
    num_rows = x32.shape[0]
    if add_to is not None:
        if not (add_to.dtype is torch.float32 and add_to.is_contiguous()
                and add_to.shape == (num_rows, n) and add_to.is_cpu):
            check_buffer(add_to, "qlinear add_to", (torch.float32,), (num_rows, n))
        if bias is not None:
            raise ValueError("qlinear: add_to takes no bias")
    out = add_to if add_to is not None else torch.empty(num_rows, n, dtype=torch.float32)
    codes, d, m = weight.pointers
    ext.qlinear(weight.fmt, x32.data_ptr(), codes, d, m, out.data_ptr(), num_rows, n, k,
                num_threads or torch.get_num_threads(), add_to is not None)
    return out if bias is None else out.add_(bias)
