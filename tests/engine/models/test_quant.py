"""Packed GGUF weights (engine.models.quant): repacking is exact, and the kernel computes
x @ W.T from them equal to the fp32 GEMM over the dequantised weights up to summation order;
a tiny model with packed decode gives the dense model's logits and greedy output."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engine.attention.dense import DenseAttention
from engine.models.decoder import DecoderModel
from engine.models.loader import LoadedModel
from engine.models.quant import PackedWeight, concat, kernel, pack_ggml, qlinear
from engine.models.weights import PackedWeights

pytestmark = pytest.mark.skipif(kernel() is None, reason="the qlinear kernel is not built")

TYPES = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0,
         GGMLQuantizationType.Q5_0]


def blocks(n: int, k: int, qtype: GGMLQuantizationType, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), qtype)


@pytest.mark.parametrize("qtype", TYPES)
def test_pack_is_exact(qtype: GGMLQuantizationType) -> None:
    raw = blocks(37, 96, qtype)
    packed = pack_ggml(qtype, raw)
    assert packed is not None and packed.shape == (37, 96)
    want = torch.from_numpy(np.asarray(dequantize(raw, qtype), dtype=np.float32))
    assert torch.equal(packed.dequantize(), want)


def test_unsupported_types_are_not_packed() -> None:
    raw = np.zeros((4, 64), dtype=np.float32)
    assert pack_ggml(GGMLQuantizationType.F32, raw) is None
    # Q5_K's per-weight fifth bit and Q6_K's 16-weight scales fit no kernel form (quant.py).
    assert pack_ggml(GGMLQuantizationType.Q5_K, np.zeros((4, 176), dtype=np.uint8)) is None
    assert pack_ggml(GGMLQuantizationType.Q6_K, np.zeros((4, 210), dtype=np.uint8)) is None
    assert pack_ggml(GGMLQuantizationType.Q5_1, np.zeros((4, 48), dtype=np.uint8)) is None


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("num_rows", [1, 2, 3, 4, 5, 9, 17])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_qlinear_equals_fp32_gemm(qtype: GGMLQuantizationType, num_rows: int,
                                  num_threads: int) -> None:
    # 53 output features: not a multiple of the kernel's chunk of 16.
    packed = pack_ggml(qtype, blocks(53, 160, qtype, seed=num_rows))
    assert packed is not None
    x = torch.randn(num_rows, 160, generator=torch.Generator().manual_seed(num_rows))
    bias = torch.randn(53)
    want = x @ packed.dequantize().T + bias
    got = qlinear(x, packed, bias, num_threads=num_threads)
    assert got.shape == (num_rows, 53) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_qlinear_takes_non_contiguous_and_empty_input() -> None:
    packed = pack_ggml(GGMLQuantizationType.Q4_1, blocks(16, 64, GGMLQuantizationType.Q4_1))
    assert packed is not None
    x = torch.randn(3, 128)[:, ::2]  # (3, 64), strided
    torch.testing.assert_close(qlinear(x, packed), x @ packed.dequantize().T, rtol=1e-5, atol=1e-5)
    assert qlinear(torch.empty(0, 64), packed).shape == (0, 16)


def test_rows_and_concat_keep_values() -> None:
    q4 = pack_ggml(GGMLQuantizationType.Q4_1, blocks(8, 64, GGMLQuantizationType.Q4_1))
    q4b = pack_ggml(GGMLQuantizationType.Q4_0, blocks(4, 64, GGMLQuantizationType.Q4_0))
    q8 = pack_ggml(GGMLQuantizationType.Q8_0, blocks(4, 64, GGMLQuantizationType.Q8_0))
    assert q4 is not None and q4b is not None and q8 is not None
    perm = torch.tensor([3, 1, 0, 2, 7, 5, 6, 4])
    assert torch.equal(q4.rows(perm).dequantize(), q4.dequantize()[perm])
    both = concat([q4, q4b])  # Q4_0 and Q4_1 share the 4-bit form
    assert both is not None
    assert torch.equal(both.dequantize(), torch.cat([q4.dequantize(), q4b.dequantize()]))
    assert concat([q4, q8]) is None


def _packed_model(tiny: LoadedModel, qtype: GGMLQuantizationType, max_rows: int) -> tuple[
        DecoderModel, DecoderModel]:
    """The tiny model's weights rounded to `qtype` (dense, the reference) and the same model
    with few-row forwards on the packed codes."""
    def pack(w: torch.Tensor) -> PackedWeight:
        packed = pack_ggml(qtype, quantize(w.numpy(), qtype))
        assert packed is not None
        return packed

    model = tiny.model
    w = model.weights
    layers = [type(layer)(attn_norm=layer.attn_norm, qkv=pack(layer.qkv), qkv_bias=None,
                          o=pack(layer.o), ffn_norm=layer.ffn_norm, gate_up=pack(layer.gate_up),
                          down=pack(layer.down)) for layer in w.layers]
    lm_head = pack(w.lm_head)
    dense_layers = [type(layer)(attn_norm=layer.attn_norm, qkv=p.qkv.dequantize(),
                                qkv_bias=None, o=p.o.dequantize(), ffn_norm=layer.ffn_norm,
                                gate_up=p.gate_up.dequantize(), down=p.down.dequantize())
                    for layer, p in zip(w.layers, layers, strict=True)]  # type: ignore[union-attr]
    embed = lm_head.dequantize()
    dense = DecoderModel(model.config, type(w)(embed, dense_layers, w.norm, embed), torch.float32)
    return dense, dense.with_packed(PackedWeights(tuple(layers), lm_head, max_rows))


@pytest.mark.parametrize("qtype", TYPES)
def test_packed_model_equals_dense(tiny: LoadedModel, qtype: GGMLQuantizationType) -> None:
    dense, packed = _packed_model(tiny, qtype, max_rows=8)
    assert packed.weights_name == "gguf codes (<= 8 rows), dense extends"
    assert dense.weights_name == "dense"
    # 9 and 40 rows: past max_rows, dense weights through the C row ops (40 splits them over
    # OpenMP threads).
    for num_rows in (1, 5, 8, 9, 40):
        ids = torch.randint(0, dense.config.vocab_size, (num_rows,),
                            generator=torch.Generator().manual_seed(num_rows))
        positions = torch.arange(num_rows)
        want = dense.logits(dense.forward(ids, positions, DenseAttention([num_rows])))
        got = packed.logits(packed.forward(ids, positions, DenseAttention([num_rows])))
        # Summation order differs (AVX-512 MKL vs the codes kernel: up to 1.5e-4 seen on a
        # Xeon); a wrong weight or code moves logits by O(1).
        torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-4)


def test_packed_decode_is_cpu_only(tiny: LoadedModel) -> None:
    _, packed = _packed_model(tiny, GGMLQuantizationType.Q8_0, max_rows=4)
    assert packed.packed is not None and packed.packed.nbytes > 0
    assert packed.with_packed(None).packed is None
