"""Llama (2, 3, 3.1/3.3 with llama3 rope), Mistral and Qwen2: the plain Llama layout, with q/k/v
biases on Qwen2 and a sliding window on Mistral where its config sets one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.config import SLIDING, ModelConfig
from engine.models.families import gguf_config, hf_config
from engine.models.families.common import gguf_llama_rules, hf_llama_rules
from engine.models.families.hf_config import refuse_unless
from engine.models.tensor_map import Rule
from engine.tokenizer_gguf import GGUFTensor

# transformers' defaults where config.json leaves the key out.
MISTRAL_DEFAULT_WINDOW = 4096


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    model_type = str(cfg.get("model_type", "llama"))
    refuse_unless(cfg, "hidden_act", lambda v: v == "silu", "a gate activation other than silu")
    refuse_unless(cfg, "mlp_bias", lambda v: not v, "biases on the MLP projections")
    fields = hf_config.common(cfg, model_type, tie_default=False)
    theta, scaling = hf_config.parse_rope(cfg, hf_config.rope_dict(cfg), 10000.0)
    window: int | None = None
    layer_types: tuple[str, ...] = ()
    if model_type == "mistral":
        window = cfg.get("sliding_window", MISTRAL_DEFAULT_WINDOW)
        layer_types = (SLIDING,) * fields["num_layers"] if window else ()
    elif model_type == "qwen2" and cfg.get("use_sliding_window"):
        window = cfg.get("sliding_window")
        layer_types = hf_config.layer_types(cfg, fields["num_layers"], window)
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**fields, rope_theta=theta, rope_scaling=scaling,
                       has_qkv_bias=model_type == "qwen2" or attention_bias,
                       has_o_bias=model_type != "qwen2" and attention_bias,
                       sliding_window=window if layer_types else None, layer_types=layer_types)


def hf_rules(cfg: ModelConfig, raw: Mapping[str, Any]) -> list[Rule]:
    return hf_llama_rules(cfg)


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, GGUFTensor]) -> ModelConfig:
    arch = str(meta["general.architecture"])
    fields = gguf_config.common(meta, tensors, arch)
    keys = gguf_config.GgufKeys(meta)
    window = keys.get("attention.sliding_window", 0) or None
    return ModelConfig(**fields, rope_scaling=gguf_config.rope_scaling(meta),
                       rope_freq_factors=gguf_config.rope_freq_factors(tensors),
                       has_qkv_bias="blk.0.attn_q.bias" in tensors,
                       has_o_bias="blk.0.attn_output.bias" in tensors,
                       sliding_window=window,
                       layer_types=(SLIDING,) * fields["num_layers"] if window else ())


def gguf_rules(cfg: ModelConfig, arch: str) -> list[Rule]:
    rules = gguf_llama_rules(cfg, permuted=arch == "llama")
    rules.append(Rule("blk.{i}.attn_output.bias", "layers.{i}.o_bias"))
    return rules
