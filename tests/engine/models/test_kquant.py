"""GGUF dequantisation in torch (engine.models.kquant) and Q4_K packing (engine.models.quant):
dequantize_ggml gives gguf-py's numpy dequantiser's values bit for bit, for random valid blocks
and for gguf's own quantised data, in 2-D and stacked 3-D tensors; Q4_K repacks exactly into
the kernel's 4-bit form, and qlinear over it equals the fp32 product up to summation order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from engine.models import kquant
from engine.models.kquant import dequantize_ggml
from engine.models.quant import PackedWeight, concat, kernel, pack_ggml, qlinear

# Byte offsets of each block's f16 scales (d, and dmin or m); every other byte is codes or
# sub-scales, where any value is valid.
F16_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q8_0: (0,), T.Q5_0: (0,), T.Q2_K: (80, 82),
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


def test_q4_k_packs_exactly() -> None:
    raw = read_only(random_blocks(T.Q4_K, (37, 768), seed=2))
    packed = pack_ggml(T.Q4_K, raw)
    assert packed is not None and packed.shape == (37, 768) and packed.m is not None
    assert packed.codes.shape == (37, 24, 16) and packed.d.shape == (37, 24)
    assert_bit_equal(packed.dequantize(), dequantize(raw, T.Q4_K))
    # 4.5 bits a weight in the file; the kernel's fp32 d and m per 32 make it 6
    assert packed.nbytes == 37 * 768 * 6 // 8


def test_q5_0_packs_exactly_into_the_8_bit_form() -> None:
    raw = read_only(random_blocks(T.Q5_0, (37, 256), seed=4))
    packed = pack_ggml(T.Q5_0, raw)
    assert packed is not None and packed.shape == (37, 256) and packed.m is None
    codes = packed.codes.view(torch.int8)
    assert codes.min() == -16 and codes.max() == 15
    assert_bit_equal(packed.dequantize(), dequantize(raw, T.Q5_0))


def test_q4_k_packs_expert_slices_and_shares_the_4_bit_form() -> None:
    stacked = read_only(random_blocks(T.Q4_K, (3, 16, 512), seed=3))
    assert pack_ggml(T.Q4_K, stacked) is None  # packed expert by expert
    experts = [pack_ggml(T.Q4_K, stacked[e]) for e in range(3)]
    for e, packed in enumerate(experts):
        assert packed is not None
        assert_bit_equal(packed.dequantize(), dequantize(stacked[e], T.Q4_K))
    q4_0 = pack_ggml(T.Q4_0, quantize(np.ones((2, 512), dtype=np.float32), T.Q4_0))
    assert q4_0 is not None and experts[0] is not None
    both = concat([experts[0], q4_0])
    assert both is not None and both.shape == (18, 512)
    perm = torch.tensor([5, 0, 17, 3])
    assert torch.equal(both.rows(perm).dequantize(), both.dequantize()[perm])


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0])
def test_older_types_pack_expert_slices(qtype: T) -> None:
    stacked = read_only(random_blocks(qtype, (2, 8, 256), seed=4))
    packed = pack_ggml(qtype, stacked[1])
    assert packed is not None
    want = dequantize(stacked[1], qtype)
    if qtype == T.Q4_0:
        # equal values, but not bits: gguf's d * (8 - 8) is -0 for d < 0, the packed form's
        # d * 8 + (-8 d) is +0, which no product or sum over the weights can tell apart
        assert torch.equal(packed.dequantize(), torch.from_numpy(want))
    else:
        assert_bit_equal(packed.dequantize(), want)


@pytest.mark.parametrize("qtype", [T.Q5_K, T.Q6_K, T.F32])
def test_types_without_an_exact_kernel_form_stay_dense(qtype: T) -> None:
    raw = random_blocks(qtype, (4, 256)) if qtype in F16_FIELDS else np.zeros((4, 256), np.float32)
    assert pack_ggml(qtype, raw) is None


def _close_to_dense(got: torch.Tensor, x: torch.Tensor, packed: PackedWeight,
                    plus: torch.Tensor | None = None) -> None:
    """got equals x @ W.T (+ plus: a bias or a residual) to 1e-5 of sum |x| |w| (+ |plus|),
    the scale of summation-order error (a plain rtol fails where terms cancel)."""
    w = packed.dequantize()
    want = x @ w.T + (plus if plus is not None else 0.0)
    bound = 1e-5 * (x.abs() @ w.abs().T + (plus.abs() if plus is not None else 0.0)) + 1e-30
    assert got.shape == want.shape and got.dtype == torch.float32
    assert bool(((got - want).abs() <= bound).all()), ((got - want).abs() / bound).max()


needs_kernel = pytest.mark.skipif(kernel() is None, reason="the qlinear kernel is not built")


@needs_kernel
@pytest.mark.parametrize("num_rows", [1, 3, 9, 16])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_q4_k_qlinear_equals_dense_product(num_rows: int, num_threads: int) -> None:
    # 53 output features: not a multiple of the kernel's chunk of 16
    packed = pack_ggml(T.Q4_K, random_blocks(T.Q4_K, (53, 768), seed=num_rows))
    assert packed is not None
    gen = torch.Generator().manual_seed(num_rows)
    x = torch.randn(num_rows, 768, generator=gen)
    bias = torch.randn(53, generator=gen)
    _close_to_dense(qlinear(x, packed, num_threads=num_threads), x, packed)
    _close_to_dense(qlinear(x, packed, bias, num_threads=num_threads), x, packed, bias)
    residual = torch.randn(num_rows, 53, generator=gen)
    got = qlinear(x, packed, num_threads=num_threads, add_to=residual.clone())
    _close_to_dense(got, x, packed, residual)
