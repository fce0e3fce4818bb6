"""Frozen model configuration, normalised from GGUF metadata or an HF config.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import UnsupportedModel

# Architectures sharing the Llama decoder layout (RMSNorm, rotary GQA attention, SwiGLU MLP).
LLAMA_FAMILY = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder. Immutable: facts found later are returned."""

    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    # Qwen2 puts biases on the q/k/v projections; Llama and Mistral do not.
    has_qkv_bias: bool = False

    def __post_init__(self) -> None:
        if self.architecture not in LLAMA_FAMILY:
            raise UnsupportedModel(
                f"architecture '{self.architecture}' is not supported; "
                f"expected one of {LLAMA_FAMILY}"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise UnsupportedModel(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_kv_values_per_token(self) -> int:
        """K and V values one token adds to the cache over all layers."""
        return 2 * self.num_layers * self.kv_size

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], vocab_size: int) -> ModelConfig:
        """From GGUF key/values (`{arch}.block_count` etc.); `vocab_size` from the token list."""
        arch = str(meta["general.architecture"])

        def get(key: str, default: Any = None) -> Any:
            full = f"{arch}.{key}"
            if full not in meta and default is None:
                raise UnsupportedModel(f"GGUF metadata lacks '{full}'")
            return meta.get(full, default)

        hidden = int(get("embedding_length"))
        num_heads = int(get("attention.head_count"))
        return cls(
            architecture=arch,
            num_layers=int(get("block_count")),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_heads=num_heads,
            num_kv_heads=int(get("attention.head_count_kv", num_heads)),
            head_dim=int(get("rope.dimension_count", hidden // num_heads)),
            vocab_size=vocab_size,
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            max_position_embeddings=int(get("context_length", 4096)),
            tie_word_embeddings=bool(meta.get("_tied", True)),
            has_qkv_bias=arch == "qwen2",
        )

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """From a transformers `config.json` dict."""
        model_type = str(cfg.get("model_type", "llama"))
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            architecture=model_type,
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            vocab_size=int(cfg["vocab_size"]),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            has_qkv_bias=model_type == "qwen2",
        )
