"""Packed weights (decodes on the GGUF's own Q4_1/Q8_0 codes, engine.models.quant; extends on
oneDNN-packed copies, engine.models.onednn) against the dense fp32 reference on the real model:
the codes are the dense weights exactly, logits differ by summation order only, and greedy
output through the engine is identical."""

from __future__ import annotations

import pytest
import torch

from benchmarks.model_speed import corpus_ids
from engine.attention.dense import DenseAttention
from engine.models.decoder import DecoderModel
from engine.models.loader import LoadedModel
from engine.models.quant import PackedWeight, kernel
from engine.reference import ContiguousKVAttention
from tests.e2e.greedy import greedy_outputs

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(kernel() is None, reason="the qlinear kernel is not built")]


def _dense(loaded: LoadedModel) -> LoadedModel:
    return LoadedModel(loaded.path, loaded.model.with_packed(None), loaded.tokenizer, 0.0)


def test_packed_weights_are_the_dense_weights(loaded_model: LoadedModel) -> None:
    model = loaded_model.model
    assert model.packed is not None, "the embedded GGUF's projections should be packed"
    names = ("qkv", "o", "gate_up", "down")
    for dense, packed in zip(model.weights.layers, model.packed.decode_layers, strict=True):
        for name in names:
            weight = getattr(packed, name)
            assert isinstance(weight, PackedWeight), name
            assert torch.equal(weight.dequantize(), getattr(dense, name)), name
    head = model.packed.lm_head
    assert isinstance(head, PackedWeight) and torch.equal(head.dequantize(),
                                                          model.weights.lm_head)


def _decode_logits(model: DecoderModel, prompt: list[int], steps: list[int]) -> torch.Tensor:
    """Prefill `prompt` (dense: many rows), then one row per token of `steps`."""
    kv = ContiguousKVAttention(model.config.num_layers)
    model.forward(torch.tensor(prompt), torch.arange(len(prompt)), kv)
    rows = []
    for i, token in enumerate(steps):
        position = torch.tensor([len(prompt) + i])
        rows.append(model.logits(model.forward(torch.tensor([token]), position, kv)))
    return torch.cat(rows)


def test_decode_logits_equal_up_to_rounding(loaded_model: LoadedModel) -> None:
    ids = corpus_ids(loaded_model.tokenizer, 340)
    packed, dense = loaded_model.model, loaded_model.model.with_packed(None)
    got = _decode_logits(packed, ids[:300], ids[300:340])
    want = _decode_logits(dense, ids[:300], ids[300:340])
    diff = (got - want).abs()
    # fp32 summation order over 576-1536 terms: ~1e-5 relative; logits are O(10).
    assert diff.max() <= 2e-3, diff.max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # Many rows (a prefill) take the oneDNN-packed dense weights: the same up to rounding.
    assert packed.packed is not None and packed.packed.extend_layers is not None
    full = torch.tensor(ids[:64])
    torch.testing.assert_close(packed.forward(full, torch.arange(64), DenseAttention([64])),
                               dense.forward(full, torch.arange(64), DenseAttention([64])),
                               rtol=1e-4, atol=1e-4)


def test_greedy_output_identical_to_dense(loaded_model: LoadedModel) -> None:
    ids = corpus_ids(loaded_model.tokenizer, 8 * 450)
    prompts = [ids[i * 450 : i * 450 + 200] for i in range(8)]
    assert greedy_outputs(loaded_model, prompts) == greedy_outputs(_dense(loaded_model), prompts)
