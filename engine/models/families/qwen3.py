"""Qwen3 (per-head q/k RMSNorm before rotary, head_dim from the config) and Qwen3-MoE (softmax
router, top-k, `norm_topk_prob`, dense layers from `mlp_only_layers`/`decoder_sparse_step`; no
shared expert). Experts load from per-expert tensors or transformers 5's fused ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.config import ModelConfig, MoEConfig
from engine.errors import UnsupportedModel
from engine.models.families import gguf_config, hf_config
from engine.models.families.common import gguf_llama_rules, hf_llama_rules
from engine.models.families.hf_config import refuse_unless
from engine.models.tensor_map import Rule
from engine.tokenizer_gguf import GGUFTensor


def _moe_layers(cfg: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Layers with experts, as transformers' Qwen3MoeDecoderLayer decides."""
    dense = set(cfg.get("mlp_only_layers") or ())
    step = int(cfg.get("decoder_sparse_step") or 1)
    return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    model_type = str(cfg.get("model_type"))
    refuse_unless(cfg, "hidden_act", lambda v: v == "silu", "a gate activation other than silu")
    fields = hf_config.common(cfg, model_type, tie_default=False)
    theta, scaling = hf_config.parse_rope(cfg, hf_config.rope_dict(cfg), 10000.0)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    layer_types = hf_config.layer_types(cfg, fields["num_layers"], window)
    moe = None
    if model_type == "qwen3_moe":
        num_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        if num_experts <= 0:
            raise UnsupportedModel("qwen3_moe config.json has no num_experts")
        moe = MoEConfig(num_experts=num_experts, top_k=int(cfg["num_experts_per_tok"]),
                        intermediate_size=int(cfg["moe_intermediate_size"]),
                        layers=_moe_layers(cfg, fields["num_layers"]),
                        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)))
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**fields, rope_theta=theta, rope_scaling=scaling, qk_norm=True,
                       has_qkv_bias=attention_bias, has_o_bias=attention_bias,
                       sliding_window=window if layer_types else None, layer_types=layer_types,
                       moe=moe)


def hf_rules(cfg: ModelConfig, raw: Mapping[str, Any]) -> list[Rule]:
    layer = "model.layers.{i}."
    rules = hf_llama_rules(cfg)
    rules += [Rule(layer + "self_attn.q_norm.weight", "layers.{i}.q_norm"),
              Rule(layer + "self_attn.k_norm.weight", "layers.{i}.k_norm"),
              Rule(layer + "mlp.gate.weight", "layers.{i}.router"),
              # transformers 5's fused layout ...
              Rule(layer + "mlp.experts.gate_up_proj", "layers.{i}.experts.gate_up"),
              Rule(layer + "mlp.experts.down_proj", "layers.{i}.experts.down"),
              # ... and the per-expert one most checkpoints use.
              Rule(layer + "mlp.experts.{e}.gate_proj.weight", "layers.{i}.experts.gate_up",
                   part="gate"),
              Rule(layer + "mlp.experts.{e}.up_proj.weight", "layers.{i}.experts.gate_up",
                   part="up"),
              Rule(layer + "mlp.experts.{e}.down_proj.weight", "layers.{i}.experts.down")]
    return rules


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, GGUFTensor]) -> ModelConfig:
    arch = str(meta["general.architecture"])
    name = "qwen3_moe" if arch == "qwen3moe" else "qwen3"
    fields = gguf_config.common(meta, tensors, name)
    moe = None
    if arch == "qwen3moe":
        keys = gguf_config.GgufKeys(meta)
        # llama.cpp runs every qwen3moe layer sparse and always renormalises the top k.
        moe = MoEConfig(num_experts=int(keys.get("expert_count")),
                        top_k=int(keys.get("expert_used_count")),
                        intermediate_size=int(keys.get("expert_feed_forward_length")),
                        layers=tuple(range(fields["num_layers"])), norm_topk_prob=True)
    return ModelConfig(**fields, rope_scaling=gguf_config.rope_scaling(meta), qk_norm=True,
                       has_qkv_bias="blk.0.attn_q.bias" in tensors,
                       has_o_bias="blk.0.attn_output.bias" in tensors, moe=moe)


def gguf_rules(cfg: ModelConfig, arch: str) -> list[Rule]:
    block = "blk.{i}."
    return [*gguf_llama_rules(cfg, permuted=False),
            Rule(block + "attn_output.bias", "layers.{i}.o_bias"),
            Rule(block + "attn_q_norm.weight", "layers.{i}.q_norm"),
            Rule(block + "attn_k_norm.weight", "layers.{i}.k_norm"),
            Rule(block + "ffn_gate_inp.weight", "layers.{i}.router"),
            Rule(block + "ffn_gate_exps.weight", "layers.{i}.experts.gate_up", part="gate"),
            Rule(block + "ffn_up_exps.weight", "layers.{i}.experts.gate_up", part="up"),
            Rule(block + "ffn_down_exps.weight", "layers.{i}.experts.down")]
