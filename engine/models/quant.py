"""Linear layers over the GGUF file's own quantised weights, for forwards of few rows.

A decode step reads every weight to produce one row per sequence, so on a CPU its time is the
weight bytes it reads: 4.5-8.5 bits a weight as the GGUF stores them, 32 as the fp32 tensors
dequantised from them. `PackedWeight` keeps the file's codes and scales (repacked, not
requantised: Q4_0 and Q4_1 become one 4-bit form with fp32 scale and offset, Q8_0 an 8-bit
form), and `qlinear` computes `x @ W.T` from them in fp32 in a C/OpenMP kernel
(csrc/qlinear_cpu.c). The weights are the very values the fp32 path uses, so the two paths
differ only in summation order; tests/engine/models/test_quant.py holds them to that.

The kernel is built by pip with the package (setup.py); without it `kernel()` is None and the
model keeps its fp32 path (the loader says so).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import torch
from gguf import GGMLQuantizationType

from engine.native import load_extension

BLOCK = 32  # weights a block, in every supported format
Q4, Q8 = 4, 8  # the kernel's format ids
# ggml type -> (bytes a block, kernel format, offset of the codes in the block)
GGML_FORMATS = {
    GGMLQuantizationType.Q4_0: (18, Q4, 2),
    GGMLQuantizationType.Q4_1: (20, Q4, 4),
    GGMLQuantizationType.Q8_0: (34, Q8, 2),
}


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
        for t in (self.codes, self.d, self.m):
            assert t is None or (t.is_contiguous() and t.device.type == "cpu")
        object.__setattr__(self, "shape", (self.codes.shape[0], self.codes.shape[1] * BLOCK))
        object.__setattr__(self, "pointers", (self.codes.data_ptr(), self.d.data_ptr(),
                                              self.m.data_ptr() if self.m is not None else 0))

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
    """A GGUF tensor's raw blocks (n rows of bytes) repacked, or None for a type the kernel does
    not read (F32, F16, K-quants: the fp32 path serves those)."""
    if tensor_type not in GGML_FORMATS or data.ndim != 2:
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


def qlinear(x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None,
            num_threads: int | None = None, *, add_to: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ W.T + bias` for x (rows, k) on the CPU -> fp32 (rows, n). With `add_to` (a
    contiguous fp32 (rows, n) tensor) the product is added into it in place (a residual
    connection with no extra pass), and `add_to` is returned."""
    ext = kernel()
    assert ext is not None, "qlinear needs the built extension"
    n, k = weight.shape
    x32 = x if x.dtype == torch.float32 and x.is_contiguous() else (
        x.detach().to(torch.float32).contiguous())
    num_rows = x32.shape[0]
    assert x32.shape[1] == k, (x32.shape, weight.shape)
    if add_to is not None:
        assert add_to.dtype == torch.float32 and add_to.is_contiguous()
        assert add_to.shape == (num_rows, n), (add_to.shape, num_rows, n)
        assert bias is None, "add_to takes no bias"
    out = add_to if add_to is not None else torch.empty(num_rows, n, dtype=torch.float32)
    codes, d, m = weight.pointers
    ext.qlinear(weight.fmt, x32.data_ptr(), codes, d, m, out.data_ptr(), num_rows, n, k,
                num_threads or torch.get_num_threads(), add_to is not None)
    return out if bias is None else out.add_(bias)
