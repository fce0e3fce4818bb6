"""Gemma 3 (text): embeddings times sqrt(hidden), (1 + w) RMSNorms before and after attention and
the MLP, q/k norms, a tanh-GELU gate, `query_pre_attn_scalar`, and sliding layers (5 of 6) with
their own rotary base. From `Gemma3ForCausalLM` folders, the text part of
`Gemma3ForConditionalGeneration` ones, and llama.cpp's `gemma3` GGUFs (norms stored + 1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.config import FULL, SLIDING, ModelConfig, Rope
from engine.errors import UnsupportedModel
from engine.models.families import gguf_config, hf_config
from engine.models.families.common import gguf_llama_rules, plus_one
from engine.models.families.hf_config import refuse_unless
from engine.models.tensor_map import Rule
from engine.tokenizer_gguf import GGUFTensor

GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0
PATTERN = 6  # layer i slides unless (i + 1) % 6 == 0 (transformers' and llama.cpp's default)
# The text weights of a multimodal checkpoint, in transformers 5's and 4's naming.
MULTIMODAL_PREFIXES = ("model.language_model.", "language_model.model.")


def _text(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    return cfg.get("text_config") or cfg


def config_from_hf(raw: Mapping[str, Any]) -> ModelConfig:
    cfg = _text(raw)
    activation = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise UnsupportedModel(f"config.json sets hidden_activation={activation!r}, "
                                         "which radixgate does not implement for Gemma 3")
    refuse_unless(cfg, "attn_logit_softcapping", lambda v: v is None, "softcapping")
    refuse_unless(cfg, "final_logit_softcapping", lambda v: v is None, "softcapping")
    refuse_unless(cfg, "use_bidirectional_attention", lambda v: not v,
                  "bidirectional attention")
    fields = hf_config.common(cfg, "gemma3", tie_default=True)
    theta, scaling = hf_config.parse_rope(cfg, hf_config.rope_dict(cfg, FULL), GLOBAL_THETA)
    local_params = hf_config.rope_dict(cfg, SLIDING) if _nested_rope(cfg) else {}
    local_theta = float(local_params.get("rope_theta") or cfg.get("rope_local_base_freq")
                        or LOCAL_THETA)
    _, local_scaling = hf_config.parse_rope(cfg, local_params, LOCAL_THETA)
    num_layers = fields["num_layers"]
    types = cfg.get("layer_types") or [
        SLIDING if (i + 1) % int(cfg.get("sliding_window_pattern") or PATTERN) else FULL
        for i in range(num_layers)]
    window = cfg.get("sliding_window")
    return ModelConfig(
        **fields, rope_theta=theta, rope_scaling=scaling,
        local_rope=Rope(local_theta, local_scaling),
        sliding_window=window, layer_types=hf_config.layer_types(
            {"layer_types": types}, num_layers, window),
        qk_norm=True, sandwich_norm=True, activation="gelu_tanh",
        embed_scale=fields["hidden_size"] ** 0.5,
        attn_scale=float(cfg.get("query_pre_attn_scalar") or 256) ** -0.5,
        has_qkv_bias=bool(cfg.get("attention_bias")), has_o_bias=bool(cfg.get("attention_bias")))


def _nested_rope(cfg: Mapping[str, Any]) -> bool:
    params = cfg.get("rope_parameters") or {}
    return SLIDING in params or FULL in params


def hf_rules(cfg: ModelConfig, raw: Mapping[str, Any]) -> list[Rule]:
    names = ("Gemma3ForConditionalGeneration",)
    multimodal = "text_config" in raw or any(a in names for a in raw.get("architectures", ()))
    rules: list[Rule] = []
    prefixes = MULTIMODAL_PREFIXES if multimodal else ("model.",)
    for prefix in prefixes:
        layer = prefix + "layers.{i}."
        rules += [Rule(prefix + "embed_tokens.weight", "embed"),
                  Rule(prefix + "norm.weight", "norm", plus_one),
                  Rule(layer + "input_layernorm.weight", "layers.{i}.attn_norm", plus_one),
                  Rule(layer + "post_attention_layernorm.weight", "layers.{i}.post_attn_norm",
                       plus_one),
                  Rule(layer + "pre_feedforward_layernorm.weight", "layers.{i}.ffn_norm",
                       plus_one),
                  Rule(layer + "post_feedforward_layernorm.weight", "layers.{i}.post_ffn_norm",
                       plus_one),
                  Rule(layer + "self_attn.q_norm.weight", "layers.{i}.q_norm", plus_one),
                  Rule(layer + "self_attn.k_norm.weight", "layers.{i}.k_norm", plus_one),
                  Rule(layer + "mlp.gate_proj.weight", "layers.{i}.gate"),
                  Rule(layer + "mlp.up_proj.weight", "layers.{i}.up"),
                  Rule(layer + "mlp.down_proj.weight", "layers.{i}.down")]
        for n in "qkvo":
            rules.append(Rule(layer + f"self_attn.{n}_proj.weight", f"layers.{{i}}.{n}"))
            rules.append(Rule(layer + f"self_attn.{n}_proj.bias", f"layers.{{i}}.{n}_bias"))
    lm_head = None if cfg.tie_word_embeddings else "lm_head"
    rules += [Rule("lm_head.weight", lm_head), Rule("language_model.lm_head.weight", lm_head),
              # The vision tower and projector of a multimodal checkpoint: not served here.
              Rule("model.vision_tower.{*}", None), Rule("vision_tower.{*}", None),
              Rule("model.multi_modal_projector.{*}", None),
              Rule("multi_modal_projector.{*}", None)]
    return rules


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, GGUFTensor]) -> ModelConfig:
    fields = gguf_config.common(meta, tensors, "gemma3")
    keys = gguf_config.GgufKeys(meta)
    num_layers = fields["num_layers"]
    hidden, num_heads = fields["hidden_size"], fields["num_heads"]
    # llama.cpp: 1/sqrt(head_dim), except the 27B (62 layers), which scales by n_embd/n_head.
    scalar = hidden // num_heads if num_layers == 62 else fields["head_dim"]
    window = int(keys.get("attention.sliding_window"))
    types = tuple(SLIDING if (i + 1) % PATTERN else FULL for i in range(num_layers))
    return ModelConfig(
        **{**fields, "rope_theta": float(keys.get("rope.freq_base", GLOBAL_THETA))},
        rope_scaling=gguf_config.rope_scaling(meta),
        local_rope=Rope(float(keys.get("rope.freq_base_swa", LOCAL_THETA))),
        sliding_window=window, layer_types=types, qk_norm=True, sandwich_norm=True,
        activation="gelu_tanh", embed_scale=hidden ** 0.5, attn_scale=scalar ** -0.5)


def gguf_rules(cfg: ModelConfig, arch: str) -> list[Rule]:
    block = "blk.{i}."
    # llama.cpp's converter stored every norm as 1 + w already.
    return [*gguf_llama_rules(cfg, permuted=False),
            Rule(block + "post_attention_norm.weight", "layers.{i}.post_attn_norm"),
            Rule(block + "post_ffw_norm.weight", "layers.{i}.post_ffn_norm"),
            Rule(block + "attn_q_norm.weight", "layers.{i}.q_norm"),
            Rule(block + "attn_k_norm.weight", "layers.{i}.k_norm")]
