"""The arithmetic of the GGUF codes kernels (csrc/ggml_*.c), in torch: the contract every kernel
build must meet bit for bit, and the reference the tests hold them to.

Weights. A quantised GGUF row is a run of ggml blocks. Every supported type reads as, per block
b of 32 weights (a K-quant super-block of 256 holds 8 of them: its sub-blocks j = 0..7),

    w_i = S_b * E_i + (second term)

with an integer E_i and an fp32 block scale S_b (`unpack`):

| type       | E_i                          | S_b        | second term, per weight            |
|------------|------------------------------|------------|------------------------------------|
| Q4_0       | q - 8                        | d          | -                                  |
| Q5_0       | q - 16                       | d          | -                                  |
| Q8_0       | q (signed)                   | d          | -                                  |
| Q4_1, Q5_1 | q                            | d          | + m (the block's offset)           |
| Q4_K, Q5_K | q                            | d * sc_j   | - dmin * m_j (the super-block's)   |
| Q6_K       | sc * (q - 32), sc per 16     | d          | -                                  |

(d, m, dmin: the f16 fields as fp32; sc_j, m_j: the 6-bit sub-block scale and min; d * sc_j is
exact in fp32.)

Activations (the int8 path, what `--dtype auto` runs), per row and per block of 32: dx = max|x|
/ 127 (fp32 division), inv = dx != 0 ? 1 / dx : 0, xq = round-half-even(x * inv) (int8), and
xs = (float)(sum of the block's xq) * dx (one fp32 rounding: the block's sum as the int8 rows
carry it). Blocks of 32 rather than llama.cpp's 256 for the K-quants: the first token of a
Qwen2 prompt carries activations thousands of times the rest, and a 256-wide block rounds the
rest of its block away (mean KL against fp32 on the 1.5B: 0.015 with 256, 0.0009 with 32).

Per (row, output), with exact integer sums I_b = sum_i E_i * xq_i, y starts at +0.0 and takes
the blocks in ascending order:

    y = fmaf((float)I_b, S_b * dx_b, y)          every type, every block
    y = fmaf(m_b, xs_b, y)                       Q4_1, Q5_1: right after it
    a = fmaf((float)m_j, xs_b, a)                Q4_K, Q5_K: a per super-block, from +0.0
    y = fmaf(a, -dmin, y)                        Q4_K, Q5_K: after the super-block's 8 blocks

`S_b * dx_b` is one fp32 multiplication, `(float)` rounds to nearest even, `fmaf` rounds once.
Integer sums do not depend on their order, and the fp32 steps are fixed per row, so a row's
output has the same bits whatever kernel computed it (one-row GEMV, multi-row verify, tiled
GEMM), whatever rows came with it and whatever SIMD the build has: the logits do not depend on
the batch or the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from engine.models.kquant import _bit_planes, _f16, _nibbles, k_scale_min

BLOCK = 32  # weights a scale block, and activations a quantisation block, for every type


@dataclass(frozen=True)
class GgmlFormat:
    """What a type's kernels need to know: ggml's weights and bytes a block (256 for the
    K-quants' super-blocks), and the second term's kind: "" none, "block" an offset per block
    (Q4_1, Q5_1), "super" a min per sub-block scaled per super-block (Q4_K, Q5_K)."""

    type_id: int
    block_weights: int
    block_bytes: int
    second_term: str


FORMATS = {
    T.Q4_0: GgmlFormat(2, 32, 18, ""),
    T.Q4_1: GgmlFormat(3, 32, 20, "block"),
    T.Q5_0: GgmlFormat(6, 32, 22, ""),
    T.Q5_1: GgmlFormat(7, 32, 24, "block"),
    T.Q8_0: GgmlFormat(8, 32, 34, ""),
    T.Q4_K: GgmlFormat(12, 256, 144, "super"),
    T.Q5_K: GgmlFormat(13, 256, 176, "super"),
    T.Q6_K: GgmlFormat(14, 256, 210, ""),
}


@dataclass(frozen=True)
class Unpacked:
    """A weight (n, k) in the canonical form: E int32 (n, k); S fp32 (n, k/32); M fp32
    (n, k/32), the offset m (Q4_1/Q5_1) or the min m_j as a float (Q4_K/Q5_K), else zeros;
    DMIN fp32 (n, k/256), -dmin (Q4_K/Q5_K), else None."""

    E: torch.Tensor
    S: torch.Tensor
    M: torch.Tensor
    DMIN: torch.Tensor | None


def _blocks(raw: np.ndarray | torch.Tensor, fmt: GgmlFormat) -> tuple[torch.Tensor, int]:
    data = torch.as_tensor(np.array(raw, copy=True)).view(torch.uint8)
    return data.reshape(-1, fmt.block_bytes), data.shape[0]


def _low_high(qs: torch.Tensor) -> torch.Tensor:
    """A 32-weight block's 16 bytes of nibbles -> 32 codes: low nibbles are weights 0-15."""
    return _nibbles(qs, 16).reshape(qs.shape[0], 32)


def _q5_high(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's 4 bytes of fifth bits (little-endian, bit j is weight j) -> (blocks, 32)."""
    word = qh.contiguous().view(torch.int32).to(torch.int64)
    return (word >> torch.arange(32)) & 1


def unpack(qtype: T, raw: np.ndarray | torch.Tensor) -> Unpacked:
    """A GGUF tensor's raw rows (n, row bytes) uint8 -> its canonical form."""
    fmt = FORMATS[qtype]
    b, n = _blocks(raw, fmt)
    dmin = None
    if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        at = 4 if qtype in (T.Q4_1, T.Q5_1) else 2
        if qtype in (T.Q5_0, T.Q5_1):
            q = _low_high(b[:, at + 4:]).to(torch.int32) | (
                _q5_high(b[:, at:at + 4]).to(torch.int32) << 4)
        else:
            q = _low_high(b[:, at:]).to(torch.int32)
        e = q - {T.Q4_0: 8, T.Q5_0: 16}.get(qtype, 0)
        s = _f16(b[:, 0:2])[:, 0]
        m = _f16(b[:, 2:4])[:, 0] if at == 4 else torch.zeros(b.shape[0])
    elif qtype == T.Q8_0:
        e = b[:, 2:].view(torch.int8).to(torch.int32)
        s, m = _f16(b[:, 0:2])[:, 0], torch.zeros(b.shape[0])
    elif qtype in (T.Q4_K, T.Q5_K):
        d, dm = _f16(b[:, 0:2]), _f16(b[:, 2:4])  # (blocks, 1)
        sc, mins = k_scale_min(b[:, 4:16])  # (blocks, 8) each
        if qtype == T.Q4_K:
            e = _nibbles(b[:, 16:], 32).to(torch.int32)  # (blocks, 8, 32)
        else:
            qh = _bit_planes(b[:, 16:48], 1).reshape(-1, 8, 32).to(torch.int32)
            e = _nibbles(b[:, 48:], 32).to(torch.int32) | (qh << 4)
        s = d * sc.float()  # exact: 11 significant bits times 6
        m = mins.float()
        dmin = (-dm[:, 0]).reshape(n, -1).contiguous()
    elif qtype == T.Q6_K:
        ql = _nibbles(b[:, 0:128], 64).reshape(-1, 8, 32).to(torch.int32)
        qh = _bit_planes(b[:, 128:192], 2).reshape(-1, 8, 32).to(torch.int32)
        sc = b[:, 192:208].contiguous().view(torch.int8).to(torch.int32)
        e = ((ql | (qh << 4)).reshape(-1, 16, 16) - 32) * sc.unsqueeze(-1)
        s = _f16(b[:, 208:210]).expand(-1, 8)
        m = torch.zeros(b.shape[0], 8)
    else:
        raise ValueError(f"no codes kernel for {qtype.name}")
    return Unpacked(e.reshape(n, -1).contiguous(), s.reshape(n, -1).contiguous(),
                    m.reshape(n, -1).contiguous(), dmin)


def dequantize(qtype: T, raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    """fp32 (n, k) weights from the canonical form (for the tests; gguf's dequantiser is the
    fp32 path's reference)."""
    u = unpack(qtype, raw)
    n, k = u.E.shape
    w = u.E.reshape(n, k // BLOCK, BLOCK).float() * u.S.unsqueeze(-1)
    second = FORMATS[qtype].second_term
    if second == "block":
        w = w + u.M.unsqueeze(-1)
    elif second == "super":
        assert u.DMIN is not None
        mins = u.M.reshape(n, k // 256, 8) * u.DMIN.unsqueeze(-1)
        w = w + mins.reshape(n, k // BLOCK).unsqueeze(-1)
    return w.reshape(n, k)


@dataclass(frozen=True)
class ActRows:
    """Activation rows quantised per block of 32: xq int8 (rows, k), dx and xs fp32
    (rows, k/32), sums int16 (rows, k/16), each 16 consecutive xq summed."""

    xq: torch.Tensor
    dx: torch.Tensor
    xs: torch.Tensor
    sums: torch.Tensor


def quantize_rows(x: torch.Tensor) -> ActRows:
    """x (rows, k) fp32 -> the int8 rows, as the contract says (the kernels' bits)."""
    rows, k = x.shape
    xb = x.float().reshape(rows, k // BLOCK, BLOCK)
    dx = xb.abs().amax(-1) / 127.0
    inv = torch.where(dx != 0, 1.0 / dx, torch.zeros_like(dx))
    xq = torch.round(xb * inv.unsqueeze(-1)).to(torch.int8)  # torch.round: half to even
    block_sums = xq.to(torch.int32).sum(-1)
    xs = block_sums.float() * dx
    sums = xq.reshape(rows, k // 16, 16).to(torch.int32).sum(-1).to(torch.int16)
    return ActRows(xq.reshape(rows, k), dx, xs, sums)


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 a * b + c rounded once, via float64: the product of two fp32 values is exact there;
    the sum rounds to float64 first, which can differ from one rounding only in ties too rare
    to meet in the tests' random data."""
    return (a.double() * b.double() + c.double()).float()


def reference_int8(x: torch.Tensor, qtype: T, raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    """y = x @ W.T (rows, n) fp32 by the int8 path's arithmetic: the kernels' bits."""
    fmt = FORMATS[qtype]
    u = unpack(qtype, raw)
    act = quantize_rows(x)
    rows, k = x.shape
    n = u.E.shape[0]
    xq = act.xq.reshape(rows, k // BLOCK, BLOCK).double()
    e = u.E.reshape(n, k // BLOCK, BLOCK).double()
    y = torch.zeros(rows, n)
    a = torch.zeros(rows, n)
    for blk in range(k // BLOCK):
        i_b = (xq[:, blk] @ e[:, blk].T).float()  # exact: |I| < 2^31
        y = _fma(i_b, u.S[:, blk].unsqueeze(0) * act.dx[:, blk].unsqueeze(1), y)
        xs = act.xs[:, blk].unsqueeze(1)
        if fmt.second_term == "block":
            y = _fma(u.M[:, blk].unsqueeze(0), xs, y)
        elif fmt.second_term == "super":
            a = _fma(u.M[:, blk].unsqueeze(0), xs, a)
            if blk % 8 == 7:
                assert u.DMIN is not None
                y = _fma(a, u.DMIN[:, blk // 8].unsqueeze(0), y)
                a = torch.zeros(rows, n)
    return y
