"""Numpy quantisers for the GGML K-quant types that gguf-py can only dequantise (Q4_K, Q5_K, Q6_K).

Contract: each `quantize_*(x)` takes float32 `(rows, cols)` with `cols % 256 == 0` and returns uint8
`(rows, cols // 256 * block_bytes)` in exactly ggml's block layout, so `gguf.quants.dequantize(out,
GGMLQuantizationType.Q*_K)` reads it back. The layout follows gguf-py's own `quants.py` (the
`dequantize_blocks` of `Q4_K`, `Q5_K`, `Q6_K` and `Q4_K.get_scale_min`):

- Q4_K, 144 bytes per 256 values: `d` f16, `dmin` f16, 12 bytes of eight 6-bit scales and eight
  6-bit mins, 128 bytes of nibbles. Value = `d*sc[j]*q - dmin*m[j]` for 32-value sub-block `j`;
  sub-block `2k` is the low nibbles of bytes `32k..32k+31` and `2k+1` their high nibbles.
- Q5_K, 176 bytes: as Q4_K plus 32 bytes `qh` before the nibbles; bit `j` of `qh[i]` is bit 4 of
  value `i` of sub-block `j`.
- Q6_K, 210 bytes: `ql` 128, `qh` 64, sixteen int8 scales, `d` f16. Value = `d*scale[j]*(q - 32)`
  for 16-value sub-block `j`, `q = ql_nibble | qh_2bits << 4`.

The quantiser is a plain min/max (Q4_K, Q5_K) or max-abs (Q6_K) fit per sub-block, not llama.cpp's
error-minimising search: values differ from llama-quantize's, the decoding does not.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _blocks(x: np.ndarray) -> np.ndarray:
    """`x` as `(n_blocks, 256)` float32; raises `ValueError` unless rows split into whole blocks."""
    if x.ndim != 2 or x.shape[1] % QK_K:
        raise ValueError(f"K-quants need 2-D rows of whole {QK_K}-value blocks, got {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK_K)


def _f16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`v` rounded to f16: the bytes to store and the float32 value the decoder will see."""
    half = v.astype(np.float16)
    return half.view(np.uint8).reshape(v.shape[0], 2), half.astype(np.float32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # All-zero sub-blocks give a zero scale; their codes are 0 whatever they divide to.
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0.0, a / np.where(b == 0, 1.0, b)).astype(np.float32)


def _affine(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Shared Q4_K/Q5_K fit: `(d|dmin bytes + packed scales, codes (n, 8, 32) in 0..levels)`."""
    sub = blocks.reshape(-1, 8, 32)
    # Decoding subtracts `dmin*m` with m >= 0, so a sub-block can only be shifted down: its low
    # end is clamped to at most zero, as ggml's make_qkx quantisers do.
    low = np.minimum(sub.min(axis=-1), 0.0)
    scale = (sub.max(axis=-1) - low) / levels
    offset = -low
    d_bytes, d = _f16(scale.max(axis=-1) / 63)
    m_bytes, dmin = _f16(offset.max(axis=-1) / 63)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_safe_div(offset, dmin[:, None])), 0, 63).astype(np.uint8)
    step = d[:, None] * sc
    shift = dmin[:, None] * mn
    q = np.rint(_safe_div(sub + shift[..., None], step[..., None]))
    q = np.clip(q, 0, levels).astype(np.uint8)
    # 12-byte scale/min packing, the inverse of gguf-py's Q4_K.get_scale_min.
    lo_sc, hi_sc, lo_mn, hi_mn = sc[:, :4], sc[:, 4:], mn[:, :4], mn[:, 4:]
    packed = np.concatenate(
        [
            lo_sc | ((hi_sc & 0x30) << 2),
            lo_mn | ((hi_mn & 0x30) << 2),
            (hi_sc & 0x0F) | ((hi_mn & 0x0F) << 4),
        ],
        axis=-1,
    ).astype(np.uint8)
    return np.concatenate([d_bytes, m_bytes, packed], axis=-1), q


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Codes `(n, 8, 32)` to 128 bytes: sub-block 2k in the low nibbles, 2k+1 in the high ones."""
    low4 = q & 0x0F
    return (low4[:, 0::2, :] | (low4[:, 1::2, :] << 4)).reshape(q.shape[0], 128).astype(np.uint8)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Q4_K blocks of float32 `x` `(rows, cols)`: uint8 `(rows, cols // 256 * 144)`."""
    blocks = _blocks(x)
    head, q = _affine(blocks, 15)
    return np.concatenate([head, _nibbles(q)], axis=-1).reshape(x.shape[0], -1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """Q5_K blocks of float32 `x` `(rows, cols)`: uint8 `(rows, cols // 256 * 176)`."""
    blocks = _blocks(x)
    head, q = _affine(blocks, 31)
    bit4 = (q >> 4) & 1  # (n, 8 sub-blocks, 32)
    qh = (bit4 << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1).astype(np.uint8)
    return np.concatenate([head, qh, _nibbles(q)], axis=-1).reshape(x.shape[0], -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K blocks of float32 `x` `(rows, cols)`: uint8 `(rows, cols // 256 * 210)`."""
    blocks = _blocks(x)
    n = blocks.shape[0]
    sub = blocks.reshape(n, 16, 16)
    # Symmetric codes -31..31 around the offset 32; int8 scales use 0..127 of their range.
    scale = np.abs(sub).max(axis=-1) / 31
    d_bytes, d = _f16(scale.max(axis=-1) / 127)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), 0, 127).astype(np.int8)
    step = d[:, None] * sc.astype(np.float32)
    q = np.clip(np.rint(_safe_div(sub, step[..., None])), -32, 31).astype(np.int16) + 32
    q = q.astype(np.uint8).reshape(n, 2, 128)  # two halves of 128 values each
    # Within a half, value v = s*64 + b sits in nibble s of ql byte b (b < 64), and
    # value v = t*32 + i has its two high bits at bits 2t of qh byte i (i < 32).
    ql = (q[:, :, :64] & 0x0F) | ((q[:, :, 64:] & 0x0F) << 4)
    high = (q >> 4).reshape(n, 2, 4, 32)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    parts = [ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d_bytes]
    return np.concatenate(parts, axis=-1).astype(np.uint8).reshape(x.shape[0], -1)
