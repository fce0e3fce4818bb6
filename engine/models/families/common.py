"""Tensor rules shared by the families: the Llama layout that most HF checkpoints and llama.cpp
GGUFs use, which families extend."""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.models.tensor_map import RowPermutation, Rule


def plus_one(tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Gemma's RMSNorm scales by (1 + w); stored as 1 + w the decoder's x * w is the same."""
    return tensor + 1.0


def hf_llama_rules(cfg: ModelConfig, prefix: str = "model.") -> list[Rule]:
    """HF names of the Llama layout (Llama, Mistral, Qwen2/3, gpt-oss's attention)."""
    layer = prefix + "layers.{i}."
    rules = [
        Rule(prefix + "embed_tokens.weight", "embed"),
        Rule(prefix + "norm.weight", "norm"),
        Rule("lm_head.weight", None if cfg.tie_word_embeddings else "lm_head"),
        Rule(layer + "input_layernorm.weight", "layers.{i}.attn_norm"),
        Rule(layer + "post_attention_layernorm.weight", "layers.{i}.ffn_norm"),
        Rule(layer + "mlp.gate_proj.weight", "layers.{i}.gate"),
        Rule(layer + "mlp.up_proj.weight", "layers.{i}.up"),
        Rule(layer + "mlp.down_proj.weight", "layers.{i}.down"),
        # Rotary frequencies some older checkpoints saved: recomputed from the config.
        Rule(prefix + "rotary_emb.inv_freq", None),
        Rule(layer + "self_attn.rotary_emb.inv_freq", None),
    ]
    for n in "qkvo":
        rules.append(Rule(layer + f"self_attn.{n}_proj.weight", f"layers.{{i}}.{n}"))
        rules.append(Rule(layer + f"self_attn.{n}_proj.bias", f"layers.{{i}}.{n}_bias"))
    return rules


UNPERMUTE_Q = RowPermutation(lambda cfg: cfg.num_heads)
UNPERMUTE_K = RowPermutation(lambda cfg: cfg.num_kv_heads)


def gguf_llama_rules(cfg: ModelConfig, *, permuted: bool) -> list[Rule]:
    """llama.cpp's names of the Llama layout. `permuted`: the converter permuted Q/K rows (it
    does so only for the `llama` architecture), which is undone here."""
    q = UNPERMUTE_Q if permuted else None
    k = UNPERMUTE_K if permuted else None
    block = "blk.{i}."
    return [
        Rule("token_embd.weight", "embed"),
        Rule("output_norm.weight", "norm"),
        Rule("output.weight", "lm_head"),
        Rule("rope_freqs.weight", None),  # read into the config (engine.config.Rope)
        Rule(block + "attn_norm.weight", "layers.{i}.attn_norm"),
        Rule(block + "attn_q.weight", "layers.{i}.q", q),
        Rule(block + "attn_k.weight", "layers.{i}.k", k),
        Rule(block + "attn_v.weight", "layers.{i}.v"),
        Rule(block + "attn_q.bias", "layers.{i}.q_bias", q),
        Rule(block + "attn_k.bias", "layers.{i}.k_bias", k),
        Rule(block + "attn_v.bias", "layers.{i}.v_bias"),
        Rule(block + "attn_output.weight", "layers.{i}.o"),
        Rule(block + "ffn_norm.weight", "layers.{i}.ffn_norm"),
        Rule(block + "ffn_gate.weight", "layers.{i}.gate"),
        Rule(block + "ffn_up.weight", "layers.{i}.up"),
        Rule(block + "ffn_down.weight", "layers.{i}.down"),
    ]
