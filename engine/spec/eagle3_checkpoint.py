"""An EAGLE-3 head's files: config.json plus model.safetensors or pytorch_model.bin, in the
public format SGLang and vLLM load (tensor names in eagle3.md §1), read and checked against the
target, and written back (tests, and later `train-draft`).

Names are stored without a `model.` prefix; one is tolerated on reading, as is vLLM's
`layers.0.` for `midlayer.`. `t2d` is skipped as the engines skip it. Any other unknown tensor
is refused: ignoring a bias or a norm would silently change the math.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig, Rope
from engine.errors import InvalidDraftHead
from engine.spec.eagle3_config import (
    Eagle3Config,
    default_captured_layer_ids,
    eagle3_config_json,
    parse_eagle3_config,
)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
BIN_FILE = "pytorch_model.bin"
EMBED = "embed_tokens.weight"
LM_HEAD = "lm_head.weight"
D2T = "d2t"
SKIPPED = frozenset({"t2d"})


@dataclass(frozen=True)
class Eagle3Checkpoint:
    """A head's config and tensors under their public names (no prefix), on the CPU, in the
    file's dtypes. `d2t` is int64; `embed_tokens.weight` and `lm_head.weight` may be absent
    (the target's embedding; tied embeddings)."""

    config: Eagle3Config
    tensors: Mapping[str, torch.Tensor]


def expected_shapes(config: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the head may hold and its shape (H = draft hidden size)."""
    h, inter = config.hidden_size, config.intermediate_size
    attn = "midlayer.self_attn."
    mlp = "midlayer.mlp."
    return {
        "fc.weight": (h, config.fused_size),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        attn + "q_proj.weight": (config.q_size, 2 * h),
        attn + "k_proj.weight": (config.kv_size, 2 * h),
        attn + "v_proj.weight": (config.kv_size, 2 * h),
        attn + "o_proj.weight": (h, config.q_size),
        "midlayer.post_attention_layernorm.weight": (h,),
        mlp + "gate_proj.weight": (inter, h),
        mlp + "up_proj.weight": (inter, h),
        mlp + "down_proj.weight": (h, inter),
        "norm.weight": (h,),
        LM_HEAD: (config.draft_vocab_size, h),
        D2T: (config.draft_vocab_size,),
        EMBED: (config.vocab_size, h),
    }


def read_eagle3_checkpoint(path: str | Path, *, target_config: ModelConfig) -> Eagle3Checkpoint:
    """Read and check a head folder against the target. Does not build the head. Raises
    `InvalidDraftHead` naming the file and the field or tensor (expected and actual values)
    when a file is missing or damaged, or the head does not fit the target."""
    folder = Path(path)
    if not folder.is_dir():
        raise InvalidDraftHead(f"EAGLE-3 head folder {folder} does not exist")
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise InvalidDraftHead(f"{folder} has no {CONFIG_FILE}")
    try:
        raw = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidDraftHead(f"{config_path} is not readable JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidDraftHead(f"{config_path} is not a JSON object")
    try:
        config = parse_eagle3_config(raw, num_target_layers=target_config.num_layers,
                                     where=str(config_path))
    except (TypeError, ValueError) as exc:  # e.g. a string where a number belongs
        raise InvalidDraftHead(f"{config_path}: a field has the wrong type: {exc}") from exc
    _check_fits_target(config, target_config, config_path)
    weights_path, tensors = _read_tensors(folder)
    _check_tensors(config, tensors, weights_path)
    return Eagle3Checkpoint(config, tensors)


def save_eagle3_head(path: str | Path, checkpoint: Eagle3Checkpoint, *,
                     file_format: Literal["safetensors", "bin"] = "safetensors",
                     name_prefix: str = "") -> None:
    """Write config.json and the tensors (as model.safetensors or pytorch_model.bin) into the
    folder `path`, created if needed; existing files of those names are replaced.
    `name_prefix`: prepended to every tensor name (e.g. "model.", as some exports do)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(eagle3_config_json(checkpoint.config),
                                                 indent=2) + "\n")
    # safetensors refuses views that share storage; contiguous copies write either format.
    tensors = {name_prefix + name: t.detach().cpu().contiguous().clone()
               for name, t in checkpoint.tensors.items()}
    if file_format == "safetensors":
        save_file(tensors, str(folder / SAFETENSORS_FILE))
    else:
        torch.save(tensors, folder / BIN_FILE)


def random_eagle3_head(target_config: ModelConfig, draft_vocab_size: int, seed: int, *,
                       scale: float = 0.05, captured_layer_ids: tuple[int, ...] | None = None,
                       with_embed: bool = False) -> Eagle3Checkpoint:
    """A random-weight head shaped like the target's layers (H = the target's hidden size), fp32.
    Its draft vocabulary is a random sorted subset of the target's. Norm weights are near 1 so
    they matter in tests. Deterministic in `seed`."""
    t = target_config
    config = Eagle3Config(
        hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_heads=t.num_heads, num_kv_heads=t.num_kv_heads, head_dim=t.head_dim,
        rms_norm_eps=t.rms_norm_eps, rope=Rope(t.rope_theta, t.rope_scaling),
        max_position_embeddings=t.max_position_embeddings, vocab_size=t.vocab_size,
        draft_vocab_size=draft_vocab_size, target_hidden_size=t.hidden_size,
        tie_word_embeddings=False,
        captured_layer_ids=captured_layer_ids or default_captured_layer_ids(t.num_layers))
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(config).items():
        if name == D2T:
            target_ids = torch.randperm(t.vocab_size, generator=gen)[:draft_vocab_size].sort()
            tensors[name] = target_ids.values - torch.arange(draft_vocab_size)
        elif name == EMBED and not with_embed:
            continue
        elif len(shape) == 1:
            tensors[name] = 1.0 + torch.randn(shape, generator=gen) * 0.1
        else:
            tensors[name] = torch.randn(shape, generator=gen) * scale
    return Eagle3Checkpoint(config, tensors)


def _check_fits_target(config: Eagle3Config, target: ModelConfig, where: Path) -> None:
    if config.vocab_size != target.vocab_size:
        raise InvalidDraftHead(f"{where}: vocab_size is {config.vocab_size}, the target's "
                               f"vocabulary has {target.vocab_size} tokens")
    if config.target_hidden_size != target.hidden_size:
        raise InvalidDraftHead(f"{where}: target_hidden_size is {config.target_hidden_size}, "
                               f"the target's hidden size is {target.hidden_size}")
    if config.tie_word_embeddings and config.draft_vocab_size != config.vocab_size:
        raise InvalidDraftHead(f"{where}: tie_word_embeddings needs draft_vocab_size = "
                               f"vocab_size ({config.vocab_size}), got {config.draft_vocab_size}")
    if config.num_heads % config.num_kv_heads:
        raise InvalidDraftHead(f"{where}: num_attention_heads={config.num_heads} is not a "
                               f"multiple of num_key_value_heads={config.num_kv_heads}")
    if config.head_dim % 2:
        raise InvalidDraftHead(f"{where}: head_dim={config.head_dim} must be even for rotary")


def _read_tensors(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The weights file's tensors under normalised names; safetensors first, then the .bin."""
    path = folder / SAFETENSORS_FILE
    try:
        if path.is_file():
            loaded: Any = load_file(str(path))
        elif (path := folder / BIN_FILE).is_file():
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise InvalidDraftHead(f"{folder} has no {SAFETENSORS_FILE} or {BIN_FILE}")
    except (OSError, RuntimeError, SafetensorError, pickle.UnpicklingError, EOFError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidDraftHead(f"{path} is damaged or not a checkpoint: {first_line}") from exc
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor)
                                               for v in loaded.values()):
        raise InvalidDraftHead(f"{path} does not hold a flat name -> tensor mapping")
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in loaded.items():
        public = _public_name(str(name))
        if public in SKIPPED:
            continue
        if public in tensors:
            raise InvalidDraftHead(f"{path} holds {public} twice (as {name} too)")
        tensors[public] = tensor
    return path, tensors


def _public_name(name: str) -> str:
    name = name.removeprefix("model.")
    if name.startswith("layers.0."):  # vLLM / speculators name the one layer layers.0
        name = "midlayer." + name.removeprefix("layers.0.")
    return name


def _check_tensors(config: Eagle3Config, tensors: Mapping[str, torch.Tensor],
                   where: Path) -> None:
    shapes = expected_shapes(config)
    unknown = sorted(set(tensors) - set(shapes))
    if unknown:
        raise InvalidDraftHead(f"{where} holds tensors an EAGLE-3 head does not have: {unknown}")
    optional = {EMBED, D2T} | ({LM_HEAD} if config.tie_word_embeddings else set())
    missing = sorted(set(shapes) - set(tensors) - optional)
    if missing:
        raise InvalidDraftHead(f"{where} lacks tensors {missing}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != shapes[name]:
            hint = (f" = (hidden_size, {len(config.captured_layer_ids)} captured layers x "
                    f"target hidden {config.target_hidden_size})" if name == "fc.weight" else "")
            raise InvalidDraftHead(f"{where}: {name} has shape {tuple(tensor.shape)}, expected "
                                   f"{shapes[name]}{hint}")
        is_int = not tensor.dtype.is_floating_point and not tensor.dtype.is_complex
        if is_int != (name == D2T):
            raise InvalidDraftHead(f"{where}: {name} has dtype {tensor.dtype}, expected "
                                   f"{'an integer' if name == D2T else 'a floating'} dtype")
    _check_d2t(config, tensors.get(D2T), where)


def _check_d2t(config: Eagle3Config, d2t: torch.Tensor | None, where: Path) -> None:
    """target_id = i + d2t[i] must name distinct tokens of the target's vocabulary."""
    if d2t is None:
        if config.draft_vocab_size != config.vocab_size:
            raise InvalidDraftHead(f"{where} lacks d2t, needed when draft_vocab_size "
                                   f"({config.draft_vocab_size}) differs from vocab_size "
                                   f"({config.vocab_size})")
        return
    target_ids = torch.arange(config.draft_vocab_size) + d2t.to(torch.int64)
    outside = ((target_ids < 0) | (target_ids >= config.vocab_size)).nonzero().flatten()
    if outside.numel():
        i = int(outside[0])
        raise InvalidDraftHead(
            f"{where}: d2t maps {outside.numel()} draft id(s) outside the target's vocabulary "
            f"0..{config.vocab_size - 1}, e.g. draft id {i} -> {int(target_ids[i])}")
    if torch.unique(target_ids).numel() != target_ids.numel():
        raise InvalidDraftHead(f"{where}: d2t maps two draft ids to the same target token")
