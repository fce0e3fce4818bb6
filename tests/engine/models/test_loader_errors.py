"""Checkpoints that do not fit their config fail at load, naming the tensor (and both shapes),
before any model exists; unsupported architectures and math the engine does not implement are
refused by name, never ignored."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import UnsupportedModel
from engine.models.loader import load_model
from tests.tiny_hf import build_tiny


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {family: build_tiny(family, tmp_path_factory.mktemp(family))
            for family in ("llama", "qwen3_moe", "gemma3")}


@pytest.fixture()
def copy_of(tiny_folders: dict[str, Path], tmp_path: Path) -> Callable[[str], Path]:
    def copy(family: str) -> Path:
        return Path(shutil.copytree(tiny_folders[family], tmp_path / family))
    return copy


def _edit_tensors(folder: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _load(folder: Path) -> None:
    load_model(str(folder), "fp32", show_progress=False)


def test_missing_tensor_is_named(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("llama")
    _edit_tensors(folder, lambda t: t.pop("model.layers.2.mlp.up_proj.weight"))
    with pytest.raises(UnsupportedModel, match=r"lacks .*'layers\.2\.up'"):
        _load(folder)


def test_extra_tensor_is_named(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("llama")
    _edit_tensors(folder, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.ones(2)}))
    with pytest.raises(UnsupportedModel, match=r"'model\.layers\.0\.mlp\.extra\.weight'"):
        _load(folder)


def test_tensor_of_a_layer_the_config_lacks_is_named(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("llama")
    _edit_config(folder, num_hidden_layers=3)
    with pytest.raises(UnsupportedModel, match=r"'model\.layers\.3\..*not used"):
        _load(folder)


def test_misshapen_tensor_names_both_shapes(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("llama")
    _edit_tensors(folder, lambda t: t.update(
        {"model.layers.1.self_attn.k_proj.weight": torch.zeros(16, 64)}))
    with pytest.raises(UnsupportedModel,
                       match=r"'model\.layers\.1\.self_attn\.k_proj\.weight'.*\[16, 64\].*"
                             r"\[32, 64\]"):
        _load(folder)


def test_missing_expert_is_named(copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("qwen3_moe")
    _edit_tensors(folder, lambda t: t.pop("model.layers.0.mlp.experts.5.up_proj.weight"))
    with pytest.raises(UnsupportedModel, match=r"'layers\.0\.experts\.gate_up' \(some experts\)"):
        _load(folder)


def test_unsupported_architecture_lists_the_supported_ones(
        copy_of: Callable[[str], Path]) -> None:
    folder = copy_of("llama")
    _edit_config(folder, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")
    with pytest.raises(UnsupportedModel, match=r"DeepseekV3ForCausalLM.*Qwen3MoeForCausalLM"):
        _load(folder)


@pytest.mark.parametrize(("family", "changes", "named"), [
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                   "rope_theta": 10000.0}}, "dynamic"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"mlp_bias": True}, "mlp_bias"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("llama", {"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
    ("gemma3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("gemma3", {"hidden_activation": "gelu"}, "hidden_activation"),
    ("gemma3", {"layer_types": ["chunked_attention"] * 6}, "chunked_attention"),
])
def test_math_that_is_not_implemented_is_refused_by_name(
        copy_of: Callable[[str], Path], family: str, changes: dict[str, Any], named: str) -> None:
    folder = copy_of(family)
    _edit_config(folder, **changes)
    with pytest.raises(UnsupportedModel, match=named):
        _load(folder)
