"""A tiny random-weight Llama with the real SmolLM2 tokenizer: fast engine tests on real code."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.models.decoder import DecoderModel
from engine.models.loader import LoadedModel
from engine.models.weights import LayerWeights, ModelWeights
from engine.tokenizer import Tokenizer


def tiny_model(tokenizer: Tokenizer, seed: int = 0, *, scale: float = 0.05) -> LoadedModel:
    """2 layers, hidden 64, 4 heads / 2 KV heads of 16: random weights, the real vocabulary."""
    cfg = ModelConfig(architecture="llama", num_layers=2, hidden_size=64, intermediate_size=128,
                      num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=tokenizer.vocab_size,
                      rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    qkv_rows = cfg.q_size + 2 * cfg.kv_size
    layers = [LayerWeights(attn_norm=torch.ones(64), qkv=rand(qkv_rows, 64), qkv_bias=None,
                           o=rand(64, cfg.q_size), ffn_norm=torch.ones(64),
                           gate_up=rand(256, 64), down=rand(64, 128))
              for _ in range(cfg.num_layers)]
    embed = rand(cfg.vocab_size, 64)
    weights = ModelWeights(embed=embed, layers=layers, norm=torch.ones(64), lm_head=embed)
    return LoadedModel(Path("tiny-random"), DecoderModel(cfg, weights, torch.float32), tokenizer,
                       0.0)
