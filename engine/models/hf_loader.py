"""HF checkpoints: a folder with config.json and model.safetensors (or a sharded index), read one
tensor at a time through the family's name map (engine.models.tensor_map)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from engine.config import ModelConfig
from engine.errors import ModelNotFound, UnsupportedModel
from engine.models import families, mxfp4
from engine.models.tensor_map import Assembler, build_weights, place
from engine.models.weights import ModelWeights


def _shard_files(folder: Path) -> list[Path]:
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    raise ModelNotFound(f"{folder} has no model.safetensors or model.safetensors.index.json")


def read_config(folder: Path) -> dict[str, Any]:
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ModelNotFound(f"{folder} has no config.json")
    raw: dict[str, Any] = json.loads(config_path.read_text())
    return raw


def load_hf(folder: Path, dtype: torch.dtype, *, show_progress: bool = True) -> tuple[
    ModelConfig, ModelWeights
]:
    """Read an HF folder of a supported family into dense `dtype` tensors on the CPU. Raises
    `UnsupportedModel` naming the tensor (and both shapes) when the checkpoint does not fit its
    config, before the model exists."""
    raw = read_config(folder)
    family = families.for_hf(raw)
    config = family.hf_config(raw)
    rules = family.hf_rules(config, raw)
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(shard), framework="pt"))
                   for shard in _shard_files(folder)]
        where = {name: handle for handle in handles for name in handle.keys()}  # noqa: SIM118
        # MXFP4 experts come as <name>_blocks and <name>_scales; they stand for <name>.
        pairs = {base: name for name in where if (base := mxfp4.pair(name)) is not None}
        scales = {base + mxfp4.SCALES for base in pairs}
        names = [n for n in where if n not in scales and mxfp4.pair(n) is None] + list(pairs)
        placements = {name: place(rules, name) for name in names}  # every name known, first
        assembler = Assembler(config, dtype)
        for name in tqdm(names, desc=f"loading {folder.name}", unit="tensor",
                         disable=not show_progress):
            placement = placements[name]
            if placement is None:
                continue
            if name in pairs:
                scale_name = name + mxfp4.SCALES
                if scale_name not in where:
                    raise UnsupportedModel(f"checkpoint has '{pairs[name]}' but not "
                                           f"'{scale_name}'")
                tensor = mxfp4.dequantize(where[pairs[name]].get_tensor(pairs[name]),
                                          where[scale_name].get_tensor(scale_name))
            else:
                tensor = where[name].get_tensor(name)
            assembler.put(name, placement, tensor)
            del tensor
        return config, build_weights(config, assembler.finish())
