"""GGUF dequantisation in torch (engine.models.kquant): dequantize_ggml gives gguf-py's numpy
dequantiser's values bit for bit, for random valid blocks and for gguf's own quantised data, in
2-D and stacked 3-D tensors. `random_blocks` here makes the random blocks of every kernel test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from engine.models import kquant
from engine.models.kquant import dequantize_ggml

# Byte offsets of each block's f16 scales (d, and dmin or m); every other byte is codes or
# sub-scales, where any value is valid.
F16_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q8_0: (0,), T.Q5_0: (0,), T.Q5_1: (0, 2),
              T.Q2_K: (80, 82),
              T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
TORCH_TYPES = [T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
FALLBACK_TYPES = [T.Q5_0, T.Q2_K]  # served by gguf's numpy code
SHAPES = [(5, 512), (3, 4, 768)]  # a matrix and a stack of three experts


def random_blocks(qtype: T, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random valid GGUF data of fp32 shape `shape`: random bytes, with the f16 scales drawn
    from floats (random f16 bits can be inf or nan) over a wide range, f16 subnormals and
    negatives included."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    *lead, cols = shape
    blocks = rng.integers(0, 256, size=(*lead, cols // block_size, type_size), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        size = (*lead, cols // block_size, 1)
        scale = rng.standard_normal(size) * 10.0 ** rng.uniform(-7, 1, size)
        blocks[..., at:at + 2] = scale.astype(np.float16).view(np.uint8)
    return blocks.reshape(*lead, -1)


def read_only(data: np.ndarray) -> np.ndarray:
    """`data` as a memory-mapped GGUF tensor comes: not writable."""
    data = data.copy()
    data.flags.writeable = False
    return data


def assert_bit_equal(got: torch.Tensor, want: np.ndarray) -> None:
    assert got.dtype == torch.float32 and tuple(got.shape) == want.shape
    assert np.array_equal(got.numpy().view(np.int32), np.asarray(want, np.float32).view(np.int32))


@pytest.mark.parametrize("qtype", TORCH_TYPES + FALLBACK_TYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_random_blocks_dequantize_as_gguf(qtype: T, shape: tuple[int, ...]) -> None:
    raw = read_only(random_blocks(qtype, shape))
    got = dequantize_ggml(qtype, raw)
    want = dequantize(raw, qtype)
    assert want.shape == shape
    assert_bit_equal(got, want)
    assert torch.equal(got, torch.from_numpy(want))


@pytest.mark.parametrize("qtype", TORCH_TYPES)
def test_chunks_cover_the_tensor(qtype: T, monkeypatch: pytest.MonkeyPatch) -> None:
    # 15 K-quant blocks in chunks of 4, or 120 32-weight blocks in chunks of 32: a short one last
    monkeypatch.setattr(kquant, "CHUNK_WEIGHTS", 1024)
    raw = read_only(random_blocks(qtype, (5, 768), seed=5))
    assert_bit_equal(dequantize_ggml(qtype, raw), dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0, T.Q5_0, T.F16, T.BF16, T.F32])
@pytest.mark.parametrize("shape", SHAPES)
def test_quantised_data_dequantizes_as_gguf(qtype: T, shape: tuple[int, ...]) -> None:
    weights = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 0.05
    raw = read_only(weights if qtype == T.F32 else quantize(weights, qtype))
    got = dequantize_ggml(qtype, raw)
    assert_bit_equal(got, dequantize(raw, qtype))
    if qtype == T.F32:
        assert torch.equal(got, torch.from_numpy(weights))


@pytest.mark.parametrize("qtype", [T.F16, T.BF16])
def test_every_half_bit_pattern_converts_as_gguf(qtype: T) -> None:
    # inf, nan (signalling ones too: torch's conversion quiets them, numpy's does not) and
    # subnormals; F16 as GGUFReader types it, BF16 as its raw bytes.
    bits = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    raw = bits.view(np.float16) if qtype == T.F16 else bits.view(np.uint8)
    assert_bit_equal(dequantize_ggml(qtype, raw), dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.Q4_K, T.Q5_0])
def test_result_is_writable_and_does_not_alias_the_data(qtype: T) -> None:
    if qtype in F16_FIELDS:
        raw = read_only(random_blocks(qtype, (4, 256)))
    else:
        dtype = np.float32 if qtype == T.F32 else np.float16
        raw = read_only(np.ones((4, 256), dtype=dtype))
    before = raw.copy()
    got = dequantize_ggml(qtype, raw)
    assert not np.shares_memory(got.numpy(), raw)
    got.fill_(7.0)
    assert np.array_equal(raw, before)
