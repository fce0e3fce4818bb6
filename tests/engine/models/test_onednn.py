"""Dense weights in oneDNN's layout (engine.models.onednn) give the F.linear results, and a
model whose extends read them gives the dense model's logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.attention.dense import DenseAttention
from engine.models import onednn
from engine.models.loader import LoadedModel, onednn_extend_layer
from engine.models.weights import PackedWeights

pytestmark = pytest.mark.skipif(not onednn.available(), reason="torch has no oneDNN")


@pytest.mark.parametrize("num_rows", [1, 7, 256, 300])
def test_onednn_linear_equals_f_linear(num_rows: int) -> None:
    gen = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(96, 160, generator=gen)
    bias = torch.randn(96, generator=gen)
    x = torch.randn(num_rows, 160, generator=gen)
    packed = onednn.OneDnnWeight.pack(weight)
    assert packed.shape == (96, 160)
    torch.testing.assert_close(onednn.onednn_linear(x, packed, bias), F.linear(x, weight, bias),
                               rtol=1e-5, atol=1e-4)
    strided = torch.randn(num_rows, 320, generator=gen)[:, ::2]
    torch.testing.assert_close(onednn.onednn_linear(strided, packed), F.linear(strided, weight),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_bf16_weights_compute_in_bf16(x_dtype: torch.dtype) -> None:
    """Mixed precision's extend weights: x (and bias) are cast to bf16, the result comes back
    in x's dtype, as F.linear on the bf16 tensors gives it."""
    if not onednn.packs(torch.bfloat16):
        pytest.skip("oneDNN has no bf16 path on this CPU (class)")
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(96, 160, generator=gen).to(torch.bfloat16)
    bias = torch.randn(96, generator=gen)
    x = torch.randn(264, 160, generator=gen).to(x_dtype)
    got = onednn.onednn_linear(x, onednn.OneDnnWeight.pack(weight), bias)
    assert got.dtype == x_dtype
    want = F.linear(x.to(torch.bfloat16), weight, bias.to(torch.bfloat16))
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_extends_on_onednn_weights_equal_dense(tiny: LoadedModel) -> None:
    dense = tiny.model
    w = dense.weights
    # max_rows 0: every forward is an extend (the decode layers are never used).
    packed = dense.with_packed(PackedWeights(tuple(w.layers), w.lm_head, max_rows=0,
                                             extend_layers=tuple(onednn_extend_layer(layer)
                                                                 for layer in w.layers)))
    assert packed.weights_name == "dense decodes, onednn extends"
    ids = torch.randint(0, dense.config.vocab_size, (40,),
                        generator=torch.Generator().manual_seed(0))
    positions = torch.arange(40)
    want = dense.logits(dense.forward(ids, positions, DenseAttention([40])))
    got = packed.logits(packed.forward(ids, positions, DenseAttention([40])))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
