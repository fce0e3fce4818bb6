"""GGUF checkpoints: metadata into the family's config, tensors through its name map, and the
projections' quantised codes for the packed CPU path.

Each tensor is dequantised on its own (engine.models.quant.dequantize_ggml) and handed to the
assembler; the codes of Q4_0/Q4_1/Q8_0/Q4_K projections are kept beside, with the same row
order (llama.cpp's Q/K permutation is undone only for the `llama` architecture, the one its
converter permutes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as T
from tqdm import tqdm

from engine.config import ModelConfig
from engine.errors import UnsupportedModel
from engine.models import families
from engine.models.linear import Weight
from engine.models.quant import PackedWeight, concat, dequantize_ggml, pack_ggml
from engine.models.tensor_map import Assembler, Placement, RowPermutation, build_weights, place
from engine.models.weights import ModelWeights, PackedWeights
from engine.tokenizer_gguf import GGUFTensor, read_gguf_metadata, read_gguf_tensors

# The tensor types loaded (and tested, tests/engine/models): others are refused by name.
# Q5_0/Q5_1 are what llama-quantize writes for K-quant tensors whose rows are not a multiple of
# 256 (Q4_K_M of a 576- or 640-wide model has them).
SUPPORTED_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                             T.Q4_K, T.Q5_K, T.Q6_K})
# Canonical projections whose codes the packed path may read, and what they fuse into.
PACKABLE = ("q", "k", "v", "o", "gate", "up", "down")


def _check_types(tensors: dict[str, GGUFTensor]) -> None:
    for t in tensors.values():
        if t.tensor_type not in SUPPORTED_TYPES:
            raise UnsupportedModel(
                f"GGUF tensor '{t.name}' has type {t.tensor_type.name}, which radixgate does not "
                f"load; supported: {', '.join(sorted(x.name for x in SUPPORTED_TYPES))}")


def load_gguf(path: Path, dtype: torch.dtype, *, show_progress: bool = True,
              packed: bool = False) -> tuple[ModelConfig, ModelWeights, PackedWeights | None]:
    """Read a GGUF of a supported family into dense `dtype` tensors on the CPU; with `packed`,
    also the projections and lm_head as their own quantised codes (`PackedWeights` without
    oneDNN extends; None when no projection is in a format the kernel reads). Raises
    `UnsupportedModel` for an unknown architecture, tensor type, name or shape, before the model
    exists."""
    meta = read_gguf_metadata(path)
    tensors = read_gguf_tensors(path)
    arch = str(meta.get("general.architecture", ""))
    family = families.for_gguf(arch)
    assert family.gguf_config is not None and family.gguf_rules is not None
    config = family.gguf_config(meta, tensors)
    rules = family.gguf_rules(config, arch)
    _check_types(tensors)
    placements = {name: place(rules, name) for name in tensors}  # every name known, first
    assembler = Assembler(config, dtype)
    codes: dict[str, PackedWeight] = {}
    for name, t in tqdm(tensors.items(), desc=f"loading {path.name}", unit="tensor",
                        disable=not show_progress):
        placement = placements[name]
        if placement is None:
            continue
        if packed:
            _keep_codes(codes, config, placement, t)
        assembler.put(name, placement, dequantize_ggml(t.tensor_type, t.data))
    weights = build_weights(config, assembler.finish())
    return config, weights, _packed_weights(config, codes, weights) if packed else None


def _keep_codes(codes: dict[str, PackedWeight], config: ModelConfig, placement: Placement,
                t: GGUFTensor) -> None:
    """Keep a projection's (or the lm_head's) codes when the kernel reads its type."""
    target = placement.target
    head = "embed" if config.tie_word_embeddings else "lm_head"
    if placement.expert is not None or placement.part is not None:
        return  # experts stay dense
    if target != head and target.rsplit(".", 1)[-1] not in PACKABLE:
        return
    weight = pack_ggml(t.tensor_type, t.data)
    if weight is None:
        return
    transform = placement.transform
    if isinstance(transform, RowPermutation):
        weight = weight.rows(transform.index(config, weight.shape[0]))
    elif transform is not None:
        return
    codes["lm_head" if target == head else target] = weight


def _packed_weights(config: ModelConfig, codes: dict[str, PackedWeight],
                    dense: ModelWeights) -> PackedWeights | None:
    """The projections and lm_head from the tensors' codes, fused as `build_weights` fuses the
    dense ones. A projection with a part not in `codes` (or parts of different formats) keeps
    its dense tensor; None when no projection is packed."""

    def fused(names: list[str], fallback: Weight | None) -> Weight | None:
        parts = [codes.get(name) for name in names]
        if fallback is None or any(p is None for p in parts):
            return fallback
        return concat([p for p in parts if p is not None]) or fallback

    layers = []
    for i, layer in enumerate(dense.layers):
        p = f"layers.{i}."
        qkv = fused([p + "q", p + "k", p + "v"], layer.qkv)
        o = fused([p + "o"], layer.o)
        assert qkv is not None and o is not None
        layers.append(replace(layer, qkv=qkv, o=o,
                              gate_up=fused([p + "gate", p + "up"], layer.gate_up),
                              down=fused([p + "down"], layer.down)))
    lm_head = fused(["lm_head"], dense.lm_head)
    assert lm_head is not None
    result = PackedWeights(tuple(layers), lm_head)
    return result if result.nbytes > 0 else None
