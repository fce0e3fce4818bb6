"""Reading GGUF metadata (`{arch}.block_count`, ...) into `ModelConfig` fields: the parts every
family shares. Key names are llama.cpp's (gguf-py's constants)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.config import RopeScaling
from engine.errors import UnsupportedModel
from engine.tokenizer_gguf import GGUFTensor

Meta = Mapping[str, Any]


class GgufKeys:
    """`{arch}.key` lookups with clear errors for missing keys."""

    def __init__(self, meta: Meta) -> None:
        self.meta = meta
        self.arch = str(meta["general.architecture"])

    def get(self, key: str, default: Any = None) -> Any:
        full = f"{self.arch}.{key}"
        if full not in self.meta:
            if default is None:
                raise UnsupportedModel(f"GGUF metadata lacks '{full}'")
            return default
        return self.meta[full]

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.meta


def vocab_size(meta: Meta) -> int:
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise UnsupportedModel("GGUF file has no tokenizer.ggml.tokens")
    return len(tokens)


def common(meta: Meta, tensors: Mapping[str, GGUFTensor], name: str) -> dict[str, Any]:
    """The `ModelConfig` fields every family reads the same way."""
    keys = GgufKeys(meta)
    hidden = int(keys.get("embedding_length"))
    num_heads = int(keys.get("attention.head_count"))
    head_dim = int(keys.get("attention.key_length",
                            keys.get("rope.dimension_count", hidden // num_heads)))
    if int(keys.get("attention.value_length", head_dim)) != head_dim:
        raise UnsupportedModel("GGUF attention.value_length differs from key_length; radixgate "
                               "needs equal K and V head sizes")
    num_kv_heads = keys.get("attention.head_count_kv", num_heads)
    if isinstance(num_kv_heads, (list, tuple)):
        raise UnsupportedModel("GGUF sets a KV head count per layer; radixgate needs one count")
    return {
        "architecture": name,
        "num_layers": int(keys.get("block_count")),
        "hidden_size": hidden,
        "intermediate_size": int(keys.get("feed_forward_length", 0)),
        "num_heads": num_heads,
        "num_kv_heads": int(num_kv_heads),
        "head_dim": head_dim,
        "vocab_size": vocab_size(meta),
        "rope_theta": float(keys.get("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(keys.get("attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": int(keys.get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
    }


def rope_scaling(meta: Meta) -> RopeScaling | None:
    """`{arch}.rope.scaling.*`: none or linear (other types are refused by name)."""
    keys = GgufKeys(meta)
    kind = str(keys.get("rope.scaling.type", "none"))
    if kind == "none":
        return None
    if kind != "linear":
        raise UnsupportedModel(f"GGUF rope.scaling.type '{kind}' is not implemented for GGUF "
                               "files; supported: none, linear")
    return RopeScaling("linear", float(keys.get("rope.scaling.factor", 1.0)))


def rope_freq_factors(tensors: Mapping[str, GGUFTensor]) -> tuple[float, ...] | None:
    """llama.cpp's `rope_freqs.weight` (Llama 3.x: the llama3 rope scaling as one factor per
    frequency), or None."""
    t = tensors.get("rope_freqs.weight")
    if t is None:
        return None
    if t.data.dtype != np.float32:
        raise UnsupportedModel(f"rope_freqs.weight is {t.tensor_type.name}; expected F32")
    return tuple(float(x) for x in np.asarray(t.data).reshape(-1))
