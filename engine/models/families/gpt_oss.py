"""gpt-oss: attention sinks, alternating 128-token windows, YaRN rope, q/k/v/o biases, and a
biased router whose softmax runs over the chosen k, feeding clamped-SwiGLU experts with
biases. Experts come as dense tensors ((E, H, 2I) with gate and up interleaved along 2I) or as
MXFP4 blocks and scales (dequantised at load, engine.models.mxfp4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from engine.config import ModelConfig, MoEConfig
from engine.models.families import hf_config
from engine.models.families.common import hf_llama_rules
from engine.models.tensor_map import Rule


def _deinterleave_rows(tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """(E, H, 2I) with gate at even and up at odd columns -> (E, 2I, H): gate rows, up rows."""
    t = tensor.transpose(1, 2)
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).contiguous()


def _deinterleave_bias(tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """(E, 2I) interleaved -> (E, 2I): gate entries, then up entries."""
    return torch.cat([tensor[:, 0::2], tensor[:, 1::2]], dim=1).contiguous()


def _transpose(tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """(E, I, H), applied as x @ W, -> (E, H, I), applied as x @ W.T."""
    return tensor.transpose(1, 2).contiguous()


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    fields = hf_config.common(cfg, "gpt_oss", tie_default=False, quant_methods=("mxfp4",))
    theta, scaling = hf_config.parse_rope(cfg, hf_config.rope_dict(cfg), 150000.0)
    window = cfg.get("sliding_window")
    num_layers = fields["num_layers"]
    types = cfg.get("layer_types") or [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    num_experts = int(cfg.get("num_local_experts") or 0)
    moe = MoEConfig(num_experts=num_experts,
                    top_k=int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0),
                    intermediate_size=fields["intermediate_size"], layers=tuple(range(num_layers)),
                    routing="topk_softmax", router_bias=True, expert_bias=True,
                    activation="swiglu_oai", swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
                    swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)))
    layer_types = hf_config.layer_types({"layer_types": types}, num_layers, window)
    return ModelConfig(**fields, rope_theta=theta, rope_scaling=scaling, has_qkv_bias=True,
                       has_o_bias=True, sliding_window=window if layer_types else None,
                       layer_types=layer_types, attn_sinks=True, moe=moe)


def hf_rules(cfg: ModelConfig, raw: Mapping[str, Any]) -> list[Rule]:
    layer = "model.layers.{i}."
    experts = layer + "mlp.experts."
    return [*hf_llama_rules(cfg),
            Rule(layer + "self_attn.sinks", "layers.{i}.sinks"),
            Rule(layer + "mlp.router.weight", "layers.{i}.router"),
            Rule(layer + "mlp.router.bias", "layers.{i}.router_bias"),
            Rule(experts + "gate_up_proj", "layers.{i}.experts.gate_up", _deinterleave_rows),
            Rule(experts + "gate_up_proj_bias", "layers.{i}.experts.gate_up_bias",
                 _deinterleave_bias),
            Rule(experts + "down_proj", "layers.{i}.experts.down", _transpose),
            Rule(experts + "down_proj_bias", "layers.{i}.experts.down_bias")]
