"""GGUF checkpoints: metadata into the family's config, tensors through its name map.

With `codes` (the served path) every quantised projection, the embedding and the lm_head stay
the file's own blocks (`GgmlTensor`, views of its copy-on-write memory map): nothing is
dequantised or copied but llama's Q/K rows, which its converter permutes (undone by copying
those rows in order). Norms, biases and unquantised tensors are read dense. Without `codes`
(the reference path) every tensor is dequantised (engine.models.kquant.dequantize_ggml).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import torch
from gguf import GGMLQuantizationType as T
from tqdm import tqdm

from engine.config import ModelConfig
from engine.errors import UnsupportedModel
from engine.models import families
from engine.models.ggml_ref import FORMATS
from engine.models.ggml_weight import GgmlTensor, GgmlWeight
from engine.models.kquant import dequantize_ggml
from engine.models.tensor_map import Assembler, Placement, build_weights, place
from engine.models.weights import ModelWeights, projections, with_projections
from engine.tokenizer_gguf import GGUFTensor, read_gguf_metadata, read_gguf_tensors

W = TypeVar("W")
DENSE_TYPES = frozenset({T.F32, T.F16, T.BF16})
# The tensor types loaded (each quantised one has a codes kernel, engine.models.ggml_weight,
# and a dequantiser): others are refused by name.
SUPPORTED_TYPES = DENSE_TYPES | frozenset(FORMATS)
# Canonical names whose quantised codes the served path reads as they are.
CODES_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def _check_types(tensors: dict[str, GGUFTensor]) -> None:
    for t in tensors.values():
        if t.tensor_type not in SUPPORTED_TYPES:
            raise UnsupportedModel(
                f"GGUF tensor '{t.name}' has type {t.tensor_type.name}, which radixgate has no "
                f"kernel for; supported: {', '.join(sorted(x.name for x in SUPPORTED_TYPES))}")


def _reads_codes(placement: Placement, tensor: GGUFTensor) -> bool:
    if tensor.tensor_type not in FORMATS or tensor.data.ndim != 2:
        return False
    if placement.expert is not None or placement.part is not None:
        return False  # MoE experts are dense (engine.models.moe)
    target = placement.target
    return target in ("embed", "lm_head") or target.rsplit(".", 1)[-1] in CODES_TARGETS


def load_gguf(path: Path, dtype: torch.dtype, *, show_progress: bool = True,
              codes: bool = False, int8: bool = True) -> tuple[ModelConfig, ModelWeights]:
    """Read a GGUF of a supported family on the CPU: dense tensors in `dtype`, and with `codes`
    the quantised projections, embedding and lm_head as `GgmlWeight`s on the int8 or fp32 path
    (`int8`). Raises `UnsupportedModel` for an unknown architecture, a tensor type without a
    kernel, a name or shape that does not fit, or a truncated file, naming the tensor, before
    anything is built."""
    meta = read_gguf_metadata(path)
    tensors = read_gguf_tensors(path, copy_on_write=codes)
    arch = str(meta.get("general.architecture", ""))
    family = families.for_gguf(arch)
    assert family.gguf_config is not None and family.gguf_rules is not None
    config = family.gguf_config(meta, tensors)
    rules = family.gguf_rules(config, arch)
    _check_types(tensors)
    placements = {name: place(rules, name) for name in tensors}  # every name known, first
    assembler = Assembler(config, dtype)
    for name, t in tqdm(tensors.items(), desc=f"loading {path.name}", unit="tensor",
                        disable=not show_progress):
        placement = placements[name]
        if placement is None:
            continue
        if codes and _reads_codes(placement, t):
            assembler.put_codes(name, placement, GgmlTensor.from_numpy(t.tensor_type, t.data))
        else:
            assembler.put(name, placement, dequantize_ggml(t.tensor_type, t.data))
    weights = build_weights(config, assembler.finish())
    if codes and not int8:
        weights = with_codes_path(weights, int8=False)
    return config, weights


def with_codes_path(weights: ModelWeights, *, int8: bool) -> ModelWeights:
    """`weights` with every GgmlWeight on the int8 (True) or fp32 path."""
    def path(w: W) -> W:
        return w.with_int8(int8) if isinstance(w, GgmlWeight) else w  # type: ignore[return-value]

    layers = [with_projections(layer, path) for layer in weights.layers]
    embed = path(weights.embed)
    lm_head = embed if weights.lm_head is weights.embed else path(weights.lm_head)
    return ModelWeights(embed, layers, weights.norm, lm_head)


def has_codes(weights: ModelWeights) -> bool:
    """Whether any weight is read from GGUF codes."""
    ws = [w for layer in weights.layers for w in projections(layer)]
    return any(isinstance(w, GgmlWeight) for w in [*ws, weights.embed, weights.lm_head])
