"""The int8 GEMM of extends (engine.models.int8_gemm): its weights are the GGUF codes exactly,
the kernel's bits equal a step-for-step torch emulation on every build (AVX512-VNNI, AVX-VNNI
built here where the CPU has it, and the portable one: tests/engine/test_isa_paths.py runs this
file on the capped builds), and its
drift from the fp32 GEMM is the activations' rounding; a tiny model's extends on it stay near
the dense model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engine import cpu_isa
from engine.attention.dense import DenseAttention
from engine.errors import InvalidRequest
from engine.models import int8_gemm, loader
from engine.models.decoder import DecoderModel
from engine.models.int8_gemm import (
    Int8Weight,
    int8_linear,
    quantize_rows,
    reference,
    reference_rows,
)
from engine.models.loader import LoadedModel
from engine.models.quant import PackedWeight, pack_ggml
from engine.models.weights import PackedWeights
from tests.engine.attention.kernel_builds import ROOT, build_variant
from tests.engine.models.test_kquant import random_blocks

pytestmark = pytest.mark.skipif(int8_gemm.kernel() is None, reason="the int8 kernel is not built")

TYPES = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0,
         GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_0]


def packed(n: int, k: int, qtype: GGMLQuantizationType, seed: int = 0) -> PackedWeight:
    rng = np.random.default_rng(seed)
    if qtype == GGMLQuantizationType.Q4_K:  # gguf-py cannot quantise to Q4_K: random blocks
        raw = random_blocks(qtype, (n, k), seed)
    else:
        raw = quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), qtype)
    weight = pack_ggml(qtype, raw)
    assert weight is not None
    want = torch.from_numpy(np.asarray(dequantize(raw, qtype), dtype=np.float32))
    assert torch.equal(weight.dequantize(), want)
    return weight


@pytest.mark.parametrize("qtype", TYPES)
def test_int8_weights_are_the_gguf_codes(qtype: GGMLQuantizationType) -> None:
    source = packed(48, 256, qtype)
    weight = Int8Weight.from_packed(source)
    assert weight is not None and weight.shape == (48, 256)
    codes = weight.code_values().double()
    d, m = (t.double() for t in weight.block_factors())
    if source.fmt == int8_gemm.Q8:
        assert codes.abs().max() <= 127
        values = codes * d.unsqueeze(-1)
        # m is the kernel's correction for its unsigned activations: -128 d sum(c).
        torch.testing.assert_close(m, -128.0 * d * codes.sum(-1))
    else:
        assert 0 <= codes.min() and codes.max() <= 15
        # Centred on 8, with the offset m + 8d rounded once to fp32: off by at most an ulp of
        # the block's largest term.
        values = (codes - 8) * d.unsqueeze(-1) + m.unsqueeze(-1)
        bound = (16 * d.abs() + m.abs()).unsqueeze(-1) * 2.0**-23
        error = (values - source.dequantize().double().reshape(values.shape)).abs()
        assert (error <= bound).all(), (error / bound).max()
        return
    torch.testing.assert_close(values.reshape(48, 256).float(), source.dequantize(),
                               rtol=0, atol=0)


def test_rows_not_a_multiple_of_16_are_not_converted() -> None:
    assert Int8Weight.from_packed(packed(40, 64, GGMLQuantizationType.Q8_0)) is None


@pytest.mark.parametrize("fmt", [int8_gemm.Q4, int8_gemm.Q8])
def test_quantized_rows_match_the_torch_steps(fmt: int) -> None:
    x = torch.randn(7, 192, generator=torch.Generator().manual_seed(fmt)) * 3
    x[2, 32:64] = 0.0  # a zero block: scale 0, codes 0
    x[4, 5] = 1e4  # an outlier takes its block's scale
    got, want = quantize_rows(x, fmt), reference_rows(x, fmt)
    assert torch.equal(got.codes, want.codes)
    assert torch.equal(got.dx, want.dx) and torch.equal(got.xs2, want.xs2)
    assert torch.equal(got.xsub, want.xsub)
    assert got.dx[2, 1] == 0


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("num_rows", [1, 3, 4, 5, 17, 64])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_kernel_bits_equal_the_emulation(qtype: GGMLQuantizationType, num_rows: int,
                                         num_threads: int) -> None:
    # 48 outputs: one pair of 16-output vectors and a single one (the kernel's edge tiles).
    weight = Int8Weight.from_packed(packed(48, 256, qtype, seed=num_rows))
    assert weight is not None
    x = torch.randn(num_rows, 256, generator=torch.Generator().manual_seed(num_rows))
    got = int8_linear(x, weight, num_threads=num_threads)
    assert got.shape == (num_rows, 48) and got.dtype == torch.float32
    assert torch.equal(got, reference(x, weight))


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_avx_vnni_build_bits_equal_the_emulation(qtype: GGMLQuantizationType,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The 256-bit vpdpbusd path (AVX2 with AVX-VNNI, no AVX-512) on this CPU, built here."""
    module = build_variant(ROOT / "engine/models/csrc/qgemm_i8_cpu.c", "x86-64-v3",
                           ("-mavxvnni",), "avx_vnni")
    if isinstance(module, str):
        pytest.skip(module)
    assert module.simd() == "avx_vnni"
    monkeypatch.setattr(int8_gemm, "kernel", lambda: module)
    weight = Int8Weight.from_packed(packed(64, 512, qtype, seed=3))
    assert weight is not None
    x = torch.randn(37, 512)
    torch.testing.assert_close(int8_linear(x, weight), reference(x, weight), rtol=0, atol=0)


@pytest.mark.parametrize("qtype", TYPES)
def test_drift_from_fp32_is_the_activation_rounding(qtype: GGMLQuantizationType) -> None:
    source = packed(64, 512, qtype)
    weight = Int8Weight.from_packed(source)
    assert weight is not None
    x = torch.randn(32, 512, generator=torch.Generator().manual_seed(1))
    want = x @ source.dequantize().T
    got = int8_linear(x, weight)
    # Rounding to 255 levels per block of 32: ~0.6% of the product's norm for Gaussian rows (a
    # wrong code, scale or offset is O(1)).
    assert (got - want).norm() / want.norm() < 0.012


def test_bias_add_to_and_bad_input() -> None:
    weight = Int8Weight.from_packed(packed(32, 64, GGMLQuantizationType.Q4_1))
    assert weight is not None
    x = torch.randn(5, 128)[:, ::2]  # strided
    bias = torch.randn(32)
    plain = int8_linear(x, weight)
    assert torch.equal(int8_linear(x, weight, bias), plain + bias)
    residual = torch.randn(5, 32)
    start = residual.clone()
    assert int8_linear(x, weight, add_to=residual) is residual
    assert torch.equal(residual, start + plain)
    assert int8_linear(torch.empty(0, 64), weight).shape == (0, 32)
    with pytest.raises(ValueError, match="does not fit"):
        int8_linear(torch.randn(2, 96), weight)
    with pytest.raises(ValueError, match="add_to"):
        int8_linear(x, weight, bias, add_to=residual)


def _int8_model(tiny: LoadedModel, qtype: GGMLQuantizationType) -> tuple[DecoderModel,
                                                                          DecoderModel]:
    """The tiny model's weights rounded to `qtype` (dense: the reference), and the same model
    with extends (more than 4 rows) on int8 GEMMs and decodes on the codes."""
    def pack(w: torch.Tensor) -> PackedWeight:
        weight = pack_ggml(qtype, quantize(w.numpy(), qtype))
        assert weight is not None
        return weight

    def int8(w: PackedWeight) -> Int8Weight:
        converted = Int8Weight.from_packed(w)
        assert converted is not None
        return converted

    model = tiny.model
    w = model.weights
    codes = [type(layer)(attn_norm=layer.attn_norm, qkv=pack(layer.qkv), qkv_bias=None,
                         o=pack(layer.o), ffn_norm=layer.ffn_norm, gate_up=pack(layer.gate_up),
                         down=pack(layer.down)) for layer in w.layers]
    extends = [type(c)(attn_norm=c.attn_norm, qkv=int8(c.qkv), qkv_bias=None, o=int8(c.o),
                       ffn_norm=c.ffn_norm, gate_up=int8(c.gate_up), down=int8(c.down))
               for c in codes]  # type: ignore[arg-type]
    dense_layers = [type(layer)(attn_norm=layer.attn_norm, qkv=c.qkv.dequantize(),
                                qkv_bias=None, o=c.o.dequantize(), ffn_norm=layer.ffn_norm,
                                gate_up=c.gate_up.dequantize(), down=c.down.dequantize())
                    for layer, c in zip(w.layers, codes, strict=True)]  # type: ignore[union-attr]
    dense = DecoderModel(model.config, type(w)(w.embed, dense_layers, w.norm, w.lm_head),
                         torch.float32)
    return dense, dense.with_packed(PackedWeights(tuple(codes), w.lm_head, 4, tuple(extends)))


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_int8_extends_stay_near_the_dense_model(tiny: LoadedModel,
                                                qtype: GGMLQuantizationType) -> None:
    dense, int8 = _int8_model(tiny, qtype)
    assert int8.weights_name == "gguf codes (<= 4 rows), int8 extends"
    num_rows = 40
    ids = torch.randint(0, dense.config.vocab_size, (num_rows,),
                        generator=torch.Generator().manual_seed(0))
    positions = torch.arange(num_rows)
    want = dense.logits(dense.forward(ids, positions, DenseAttention([num_rows])))
    got = int8.logits(int8.forward(ids, positions, DenseAttention([num_rows])))
    # Each GEMM is off by ~0.5% of its norm; the random tiny model amplifies that to 5.3-6.7%
    # of the logits' norm (measured), where a wrong code, scale or layout is ~100%.
    # tests/e2e/test_int8.py bounds the real model's drift.
    relative = (got - want).norm() / want.norm()
    assert relative < 0.15, relative


def test_int8_dtype_needs_vnni(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int8_gemm, "has_vnni", lambda: False)
    with pytest.raises(InvalidRequest, match="AVX512-VNNI"):
        loader.load_model(None, "int8", show_progress=False)
    monkeypatch.delenv(cpu_isa.CAP_ENV, raising=False)
    monkeypatch.setattr(cpu_isa, "auto_dtype", lambda: ("avx512", cpu_isa.DtypeChoice("int8",
                                                                                   "test")))
    name, choice = loader.auto_cpu_dtype()
    assert (name, choice.dtype) == ("avx512", "fp32") and "not built with VNNI" in choice.why


def test_auto_dtype_takes_int8_on_avx512_vnni_without_bf16(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_isa.CAP_ENV, raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    avx512 = "fpu sse2 avx2 fma avx512f avx512bw avx512dq avx512vl"
    cpuinfo.write_text(f"flags\t\t: {avx512} avx512_vnni\n")
    assert cpu_isa.auto_dtype(cpuinfo) == ("avx512", cpu_isa._AVX512_VNNI)
    cpuinfo.write_text(f"flags\t\t: {avx512}\n")
    assert cpu_isa.auto_dtype(cpuinfo)[1].dtype == "fp32"
    cpuinfo.write_text(f"flags\t\t: {avx512} avx512_vnni avx512_bf16\n")
    assert cpu_isa.auto_dtype(cpuinfo)[1].dtype == "mixed"


def test_auto_dtype_takes_int8_on_avx_vnni_without_avx512(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_isa.CAP_ENV, raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse2 avx2 fma avx_vnni\n")
    assert cpu_isa.auto_dtype(cpuinfo) == ("avx2", cpu_isa._AVX_VNNI)
    cpuinfo.write_text("flags\t\t: fpu sse2 avx2 fma\n")  # Zen 3
    assert cpu_isa.auto_dtype(cpuinfo)[1].dtype == "fp32"
    # Capped below avx2, the flag goes with the class.
    cpuinfo.write_text("flags\t\t: fpu sse2 avx2 fma avx_vnni\n")
    monkeypatch.setenv(cpu_isa.CAP_ENV, "baseline")
    assert cpu_isa.auto_dtype(cpuinfo)[1].dtype == "fp32"
