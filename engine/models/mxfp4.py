"""MXFP4 expert weights (gpt-oss checkpoints), dequantised at load.

A checkpoint stores `<name>_blocks` (E, rows, cols/32, 16) uint8 — two e2m1 values a byte, the
low nibble first — and `<name>_scales` (E, rows, cols/32) uint8, a power-of-two exponent
biased by 127 for each block of 32 values. Dequantised, a (E, rows, cols) tensor is the
transpose of the dense parameter, as transformers' `convert_moe_packed_tensors` returns it.
"""

from __future__ import annotations

import torch

from engine.errors import UnsupportedModel

# The 16 values of an e2m1 code, sign bit highest.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCKS, SCALES = "_blocks", "_scales"


def dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(E, rows, G, 16) codes and (E, rows, G) exponents -> fp32 (E, G * 32, rows): the dense
    parameter's layout (cols first), as the checkpoint's unquantised form stores it."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise UnsupportedModel(f"MXFP4 blocks/scales must be uint8, got {blocks.dtype}/"
                               f"{scales.dtype}")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise UnsupportedModel(f"MXFP4 blocks {list(blocks.shape)} do not match scales "
                               f"{list(scales.shape)}")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)
    values = values.flatten(-2)  # (..., G, 32): low nibble, high nibble, next byte, ...
    out = torch.ldexp(values, (scales.to(torch.int32) - 127).unsqueeze(-1))
    return out.flatten(-2).transpose(1, 2).contiguous()


def pair(name: str) -> str | None:
    """The dense name a `_blocks` tensor stands for, or None for other names."""
    return name[: -len(BLOCKS)] if name.endswith(BLOCKS) else None
