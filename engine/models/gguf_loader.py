"""GGUF checkpoints: metadata, dequantised weights, the quantised codes, un-permuted Q/K."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf.quants import dequantize
from tqdm import tqdm

from engine.config import ModelConfig
from engine.errors import UnsupportedModel
from engine.models.linear import Weight
from engine.models.llama import LayerWeights, LlamaWeights, PackedWeights
from engine.models.quant import PackedWeight, concat, pack_ggml
from engine.tokenizer_gguf import read_gguf_metadata, read_gguf_tensors


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's permutation of Q/K rows, which it applies so interleaved (GPT-J style)
    rotary can be used; the forward here uses the HF "rotate half" layout."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _vocab_size(meta: dict[str, Any]) -> int:
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise UnsupportedModel("GGUF file has no tokenizer.ggml.tokens")
    return len(tokens)


def load_gguf(path: Path, dtype: torch.dtype, *, show_progress: bool = True,
              packed: bool = False) -> tuple[ModelConfig, LlamaWeights, PackedWeights | None]:
    """Read a Llama-family GGUF into dense `dtype` tensors on the CPU; with `packed`, also the
    projections and lm_head as their own quantised codes (`PackedWeights` without oneDNN
    extends; None when no projection is in a format the kernel reads).

    Q4_0/Q4_1/Q8_0 tensors are dequantised from their packed codes in torch (the values the
    `gguf` package's numpy dequantiser gives, several times faster; tests/engine/models); other
    types through `gguf`."""
    meta = read_gguf_metadata(path)
    tensors = read_gguf_tensors(path)
    meta["_tied"] = "output.weight" not in tensors
    config = ModelConfig.from_gguf_metadata(meta, _vocab_size(meta))
    codes: dict[str, PackedWeight] = {}

    progress = tqdm(
        total=len(tensors), desc=f"loading {path.name}", unit="tensor", disable=not show_progress
    )

    def get(name: str) -> torch.Tensor:
        if name not in tensors:
            raise UnsupportedModel(f"GGUF file lacks tensor '{name}'")
        t = tensors[name]
        progress.update(1)
        packed_weight = pack_ggml(t.tensor_type, t.data)
        if packed_weight is not None:
            codes[name] = packed_weight
            return packed_weight.dequantize().to(dtype)
        # Copy: unquantised tensors come back as read-only views of the memory-mapped file.
        array = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, copy=True)
        return torch.from_numpy(array).to(dtype)

    def get_bias(name: str) -> torch.Tensor | None:
        return get(name) if name in tensors else None

    layers = []
    for i in range(config.num_layers):
        p = f"blk.{i}."
        q = unpermute_qk(get(p + "attn_q.weight"), config.num_heads)
        k = unpermute_qk(get(p + "attn_k.weight"), config.num_kv_heads)
        v = get(p + "attn_v.weight")
        biases = [get_bias(p + f"attn_{n}.bias") for n in "qkv"]
        qkv_bias = torch.cat([b for b in biases if b is not None]) if all(
            b is not None for b in biases
        ) else None
        layers.append(
            LayerWeights(
                attn_norm=get(p + "attn_norm.weight"),
                qkv=torch.cat([q, k, v], dim=0),
                qkv_bias=qkv_bias,
                o=get(p + "attn_output.weight"),
                ffn_norm=get(p + "ffn_norm.weight"),
                gate_up=torch.cat([get(p + "ffn_gate.weight"), get(p + "ffn_up.weight")], dim=0),
                down=get(p + "ffn_down.weight"),
            )
        )
    embed = get("token_embd.weight")
    norm = get("output_norm.weight")
    lm_head = embed if config.tie_word_embeddings else get("output.weight")
    progress.close()
    weights = LlamaWeights(embed=embed, layers=layers, norm=norm, lm_head=lm_head)
    return config, weights, _packed_weights(config, codes, weights) if packed else None


def _packed_weights(config: ModelConfig, codes: dict[str, PackedWeight],
                    dense: LlamaWeights) -> PackedWeights | None:
    """The projections and lm_head from the tensors' codes, fused and permuted as `load_gguf`
    fuses and permutes the dense ones. A projection with a part not in `codes` keeps its dense
    tensor; None when no projection is packed."""

    def packed(names: list[str], heads: list[int | None], fallback: Weight) -> Weight:
        parts = []
        for name, num_heads in zip(names, heads, strict=True):
            part = codes.get(name)
            if part is None:
                return fallback
            if num_heads is not None:  # the Q/K row permutation of `unpermute_qk`
                part = part.rows(unpermute_qk(torch.arange(part.shape[0]), num_heads))
            parts.append(part)
        return concat(parts) or fallback

    layers = []
    for i, layer in enumerate(dense.layers):
        p = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=layer.attn_norm, qkv_bias=layer.qkv_bias, ffn_norm=layer.ffn_norm,
            qkv=packed([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
                       [config.num_heads, config.num_kv_heads, None], layer.qkv),
            o=packed([p + "attn_output.weight"], [None], layer.o),
            gate_up=packed([p + "ffn_gate.weight", p + "ffn_up.weight"], [None, None],
                           layer.gate_up),
            down=packed([p + "ffn_down.weight"], [None], layer.down)))
    head_name = "token_embd.weight" if config.tie_word_embeddings else "output.weight"
    result = PackedWeights(tuple(layers), packed([head_name], [None], dense.lm_head))
    return result if result.nbytes > 0 else None
