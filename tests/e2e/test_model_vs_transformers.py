"""Our GGUF loader + dense forward against HF transformers on the same GGUF file: an
implementation nobody here wrote. transformers dequantises the GGUF to fp32 as we do."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from engine.attention.dense import DenseAttention
from engine.models.loader import LoadedModel
from engine.reference import reference_generate
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

# Bound on |our logit - HF logit| over 128 positions x 49152 vocab; measured 6.9e-05.
MAX_ABS_LOGIT_DIFF = 1e-3


@pytest.fixture(scope="module")
def hf_model(loaded_model: LoadedModel) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    path = loaded_model.path
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    return model


def teacher_text() -> str:
    return inspect.getsource(json.dumps)[:2000]


def test_logits_match_transformers(loaded_model: LoadedModel, hf_model: torch.nn.Module) -> None:
    ids = torch.tensor(loaded_model.tokenizer.encode(teacher_text())[:128])
    assert ids.numel() == 128
    hidden = loaded_model.model.forward(ids, torch.arange(128), DenseAttention([128]))
    ours = loaded_model.model.logits(hidden)
    with torch.no_grad():
        theirs = hf_model(ids.unsqueeze(0)).logits[0].float()
    max_diff = (ours - theirs).abs().max().item()
    print(f"max |logit diff| over 128 positions: {max_diff:.3e}")
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1)), "top-1 differs at some position"
    assert max_diff < MAX_ABS_LOGIT_DIFF


def test_greedy_matches_transformers_generate(loaded_model: LoadedModel,
                                              hf_model: torch.nn.Module) -> None:
    tok = loaded_model.tokenizer
    prompt = ("<|im_start|>user\nWrite a Python function that returns the square of a number."
              "<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(prompt)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    ours = reference_generate(loaded_model.model, ids, params)
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                eos_token_id=None, pad_token_id=tok.eos_token_id)
    assert ours == out[0, len(ids):].tolist()


def test_recompute_reference_equals_contiguous_kv(loaded_model: LoadedModel) -> None:
    ids = loaded_model.tokenizer.encode(teacher_text())[:60]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    assert reference_generate(loaded_model.model, ids, params, recompute=True) == \
        reference_generate(loaded_model.model, ids, params)
