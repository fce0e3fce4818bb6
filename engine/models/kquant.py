"""GGUF tensors dequantised in torch, bit for bit what gguf-py's numpy dequantiser gives.

`gguf.quants.dequantize` is numpy over groups of 16 rows; for a multi-GB K-quant model that is
most of the load time. Here Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K (the types of Q4_0/Q8_0 files
and of the Q4_K_M/Q5_K_M mixes) are unpacked by torch ops over chunks of thousands of blocks,
which run on all cores, and F32/F16/BF16 are converted directly; every other type goes to gguf's
numpy code.

Bit-equality: each formula performs the same fp32 operations in the same order as gguf-py's
`dequantize_blocks` (quoted beside it), on the same operands. Elementwise fp32 `*`, `+` and `-`
are correctly rounded in both libraries, so the same sequence gives the same bits; the ops are
kept separate (no addcmul, which may be fused into one rounding). Most products are exact anyway
(an f16 scale has 11 significant bits, a 6-bit sub-scale 6 and a code at most 6, so d * sc * q
fits fp32's 24), but the final add of an offset in Q4_1, Q4_K and Q5_K rounds: order matters.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quant_shape_from_byte_shape

QK_K = 256  # weights a K-quant super-block


def _f16(field: torch.Tensor) -> torch.Tensor:
    """Two bytes per block (n, 2) uint8 -> (n, 1) fp32, the f16 they hold."""
    return field.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """(n, bytes) uint8 -> (n, bytes / width * 2, width): for each run of `width` bytes, its
    low nibbles then its high nibbles (the layout of Q4_0's 16 and the K-quants' 32 and 64)."""
    runs = qs.reshape(qs.shape[0], -1, 1, width)
    return torch.cat([runs & 0x0F, runs >> 4], dim=2).reshape(qs.shape[0], -1, width)


def k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes of packed 6-bit scales and mins (n, 12) uint8 -> sc, m (n, 8)
    uint8, as gguf's `Q4_K.get_scale_min` unpacks them."""
    s = scales.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def q4_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K blocks (n, 144) uint8 -> per 32-weight sub-block scale d * sc and offset
    dmin * m, (n, 8) fp32 each, and codes (n, 8, 32) uint8 in 0..15: weight i of sub-block s
    is scale[s] * q[s, i] - offset[s]. Shared with quant.pack_ggml, which keeps the parts."""
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, m = k_scale_min(blocks[:, 4:16])
    # gguf: d = d * sc.astype(np.float32); dm = dmin * m.astype(np.float32)
    return d * sc.float(), dmin * m.float(), _nibbles(blocks[:, 16:], 32)


# Each writes a chunk of blocks' weights into `out` (n, weights a block), a view of the result:
# codes are converted straight into it and scaled in place, so nothing of the result's size is
# allocated besides it (fresh memory costs a page fault per 4 KiB, as much as the arithmetic).


def _q4_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # gguf: d * (q.astype(int8) - 8).astype(float32); q - 8 is exact in fp32 too
    out.copy_(_nibbles(b[:, 2:], 16).view(out.shape))
    out.sub_(8.0).mul_(_f16(b[:, 0:2]))


def _q4_1(b: torch.Tensor, out: torch.Tensor) -> None:
    # gguf: (d * q) + m
    out.copy_(_nibbles(b[:, 4:], 16).view(out.shape))
    out.mul_(_f16(b[:, 0:2])).add_(_f16(b[:, 2:4]))


def _q8_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # gguf: x * d
    out.copy_(b[:, 2:].view(torch.int8))
    out.mul_(_f16(b[:, 0:2]))


def _q4_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # gguf: d * q - dm, with d = d * sc and dm = dmin * m per sub-block
    scale, offset, q = q4_k_parts(b)
    w = out.view(q.shape)
    w.copy_(q)
    w.mul_(scale.unsqueeze(-1)).sub_(offset.unsqueeze(-1))


def _bit_planes(qh: torch.Tensor, bits: int) -> torch.Tensor:
    """(n, m * 32) uint8 -> (n, m, 8 / bits, 32): plane p of run r holds bits [p * bits,
    (p + 1) * bits) of each byte of run r, shifted down to bit 0 (Q5_K's 1-bit and Q6_K's 2-bit
    high parts). Four bytes to an int32 lane: a shift per plane instead of a shift by a
    broadcast tensor, which torch does not vectorise; the mask keeps each byte's own bits."""
    n = qh.shape[0]
    # contiguous() keeps a single row's stride (a slice of its block): copy it to view it.
    qh = qh.contiguous() if n > 1 else qh.clone(memory_format=torch.contiguous_format)
    words = qh.view(torch.int32).view(n, -1, 1, 8)
    mask = (1 << bits) - 1
    mask |= mask << 8 | mask << 16 | mask << 24
    planes = [(words >> shift) & mask for shift in range(0, 8, bits)]
    return torch.cat(planes, dim=2).view(torch.uint8).view(n, -1, 8 // bits, 32)


def _q5_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # gguf: as Q4_K with q = ql | (qh_bit << 4); qh's bit s is sub-block s's high bit
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = k_scale_min(b[:, 4:16])
    scale, offset = d * sc.float(), dmin * m.float()
    qh = _bit_planes(b[:, 16:48], 1).view(n, 8, 32)
    w = out.view(n, 8, 32)
    w.copy_(_nibbles(b[:, 48:], 32).bitwise_or_(qh << 4))
    w.mul_(scale.unsqueeze(-1)).sub_(offset.unsqueeze(-1))


def _q6_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # gguf: (d * scales) * (q.astype(int8) - 32) over 16-weight sub-blocks; q - 32 is exact in
    # fp32 too, where torch subtracts faster than in int8
    n = b.shape[0]
    scale = _f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float()
    ql = _nibbles(b[:, 0:128], 64).view(n, 8, 32)
    qh = _bit_planes(b[:, 128:192], 2).view(n, 8, 32)
    w = out.view(n, 8, 32)
    w.copy_(ql.bitwise_or_(qh << 4))
    w.sub_(32.0)
    out.view(n, QK_K // 16, 16).mul_(scale.unsqueeze(-1))


BLOCK_DEQUANTIZERS: dict[GGMLQuantizationType, Callable[[torch.Tensor, torch.Tensor], None]] = {
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}
# Weights a chunk (8 MiB of output): its temporaries, a few bytes a weight, are reused by the
# allocator instead of faulted in afresh, and the chunks are few, since each of the dozen torch
# calls a chunk makes is a fork and join of the thread pool, which costs a scheduler slice when
# another process holds a core (there 2^19 took several times numpy's time; alone on one
# thread, 2^21 ran as fast as 2^19).
CHUNK_WEIGHTS = 1 << 21


def _as_bytes(data: np.ndarray) -> np.ndarray:
    """The array's bytes, last axis contiguous (a view where it already is)."""
    return np.ascontiguousarray(data).view(np.uint8)


def _fresh(array: np.ndarray) -> torch.Tensor:
    """A writable torch copy of `array`, so that no result aliases a (read-only) memory map."""
    return torch.from_numpy(np.array(array))  # np.array copies, into a plain ndarray


def _f16_to_f32(half: torch.Tensor) -> torch.Tensor:
    """f16 -> fp32 as numpy converts: torch (the CPU's instruction) sets the quiet bit of a
    signalling NaN and numpy keeps it clear; only NaNs differ, so only tensors with one pay
    for the fix."""
    out = half.float()
    nan = torch.isnan(out)
    if bool(nan.any()):
        signalling = nan & ((half.view(torch.int16) & 0x0200) == 0)
        bits = out.view(torch.int32)
        bits[signalling] &= ~0x00400000
    return out


def dequantize_ggml(tensor_type: GGMLQuantizationType, data: np.ndarray) -> torch.Tensor:
    """A GGUF tensor's data as `GGUFReader` gives it -> fp32, equal bit for bit to
    `gguf.quants.dequantize(data, tensor_type)`, in a new writable tensor that shares no memory
    with `data`. Quantised data is (..., bytes a row) bytes -> (..., columns), any number of
    leading axes (stacked MoE experts are (E, rows, bytes) -> (E, rows, columns)); F32, F16 and
    BF16 data may be typed or raw bytes. Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F32, F16 and BF16
    are computed in torch; other types by gguf's numpy code (which raises NotImplementedError
    for types it does not know)."""
    if tensor_type == GGMLQuantizationType.F32:
        return _fresh(_as_bytes(data).view(np.float32))
    if tensor_type == GGMLQuantizationType.F16:
        return _f16_to_f32(_fresh(_as_bytes(data).view(np.float16)))
    if tensor_type == GGMLQuantizationType.BF16:
        # gguf: (bits.astype(int32) << 16).view(float32), which keeps NaN payloads as they are
        bits = _fresh(_as_bytes(data).view(np.int16)).to(torch.int32) << 16
        return bits.view(torch.float32)
    block_fn = BLOCK_DEQUANTIZERS.get(tensor_type)
    if block_fn is None:
        values = np.asarray(gguf_dequantize(data, tensor_type), dtype=np.float32)
        return _fresh(values) if np.may_share_memory(values, data) else torch.from_numpy(values)
    raw = _as_bytes(data)
    shape = quant_shape_from_byte_shape(raw.shape, tensor_type)
    block_size, type_size = GGML_QUANT_SIZES[tensor_type]
    blocks = raw.reshape(-1, type_size)
    out = torch.empty(blocks.shape[0], block_size)
    step = max(1, CHUNK_WEIGHTS // block_size)
    for start in range(0, blocks.shape[0], step):  # chunks of thousands of blocks, not blocks
        block_fn(_fresh(blocks[start:start + step]), out[start:start + step])
    return out.reshape(shape)
