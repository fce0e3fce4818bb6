"""gpt-oss checkpoints with MXFP4 experts (as the real ones ship): dequantised at load to the values
transformers' own dequantiser gives, and the model then matches transformers loading the same
folder (which dequantises MXFP4 on a CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models import mxfp4
from engine.models.loader import load_model
from tests.engine.models.family_checks import (
    engine_greedy,
    hf_generate,
    hf_model,
    max_logit_diff,
    prompts,
)
from tests.tiny_hf import build_tiny

transformers = pytest.importorskip("transformers")
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402


def _random_mxfp4(gen: torch.Generator, *shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (…, G, 16) and exponents (…, G) of a (…, G * 32) weight, values ~0.1-0.5."""
    blocks = torch.randint(0, 256, (*shape, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(122, 126, shape, generator=gen, dtype=torch.uint8)
    return blocks, scales


def test_dequantize_equals_transformers() -> None:
    gen = torch.Generator().manual_seed(0)
    blocks, scales = _random_mxfp4(gen, 3, 10, 4)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(mxfp4.dequantize(blocks, scales), want)


@pytest.fixture(scope="module")
def mxfp4_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny gpt-oss with its experts replaced by random MXFP4 blocks and scales."""
    folder = build_tiny("gpt_oss", tmp_path_factory.mktemp("gpt_oss_mxfp4"))
    tensors = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    gen = torch.Generator().manual_seed(1)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    experts = config["num_local_experts"]
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}.mlp.experts."
        for name, rows, cols in (("gate_up_proj", 2 * inter, hidden), ("down_proj", hidden, inter)):
            del tensors[prefix + name]
            blocks, scales = _random_mxfp4(gen, experts, rows, cols // 32)
            tensors[prefix + name + "_blocks"] = blocks
            tensors[prefix + name + "_scales"] = scales
    save_file(tensors, folder / "model.safetensors")
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_mxfp4_checkpoint_matches_transformers(mxfp4_folder: Path) -> None:
    loaded = load_model(str(mxfp4_folder), "fp32", show_progress=False, packed=False)
    first, second = prompts(loaded.tokenizer.encode)
    # Dequantised by transformers itself (with triton installed it would fetch hub kernels).
    hf = hf_model(mxfp4_folder,
                  quantization_config=transformers.Mxfp4Config(dequantize=True))
    diff = max_logit_diff(loaded.model, "torch", hf, first, second)
    assert diff < 2e-4, diff
    (result,) = engine_greedy(loaded, [first])
    assert result.output_token_ids == hf_generate(hf, first)
