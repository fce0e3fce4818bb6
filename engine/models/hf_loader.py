"""HF checkpoints: a folder with config.json and model.safetensors (or a sharded index)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from engine.config import ModelConfig
from engine.errors import ModelNotFound, UnsupportedModel
from engine.models.llama import LayerWeights, LlamaWeights


def _shard_files(folder: Path) -> list[Path]:
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    raise ModelNotFound(f"{folder} has no model.safetensors or model.safetensors.index.json")


def load_hf(folder: Path, dtype: torch.dtype, *, show_progress: bool = True) -> tuple[
    ModelConfig, LlamaWeights
]:
    """Read an HF Llama/Qwen2/Mistral folder into dense `dtype` tensors on the CPU."""
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ModelNotFound(f"{folder} has no config.json")
    config = ModelConfig.from_hf_config(json.loads(config_path.read_text()))
    raw: dict[str, torch.Tensor] = {}
    for shard in tqdm(_shard_files(folder), desc="loading shards", disable=not show_progress):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                raw[name] = f.get_tensor(name).to(dtype)

    def get(name: str) -> torch.Tensor:
        if name not in raw:
            raise UnsupportedModel(f"checkpoint lacks tensor '{name}'")
        return raw[name]

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        bias_names = [a + f"{n}_proj.bias" for n in "qkv"]
        qkv_bias = torch.cat([get(n) for n in bias_names]) if bias_names[0] in raw else None
        layers.append(
            LayerWeights(
                attn_norm=get(p + "input_layernorm.weight"),
                qkv=torch.cat([get(a + f"{n}_proj.weight") for n in "qkv"], dim=0),
                qkv_bias=qkv_bias,
                o=get(a + "o_proj.weight"),
                ffn_norm=get(p + "post_attention_layernorm.weight"),
                gate_up=torch.cat(
                    [get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], dim=0
                ),
                down=get(p + "mlp.down_proj.weight"),
            )
        )
    embed = get("model.embed_tokens.weight")
    tied = config.tie_word_embeddings or "lm_head.weight" not in raw
    lm_head = embed if tied else get("lm_head.weight")
    return config, LlamaWeights(embed=embed, layers=layers, norm=get("model.norm.weight"),
                                lm_head=lm_head)
