"""One entry point for loading a model with its tokenizer, whatever the checkpoint format."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.errors import InvalidRequest
from engine.models.gguf_loader import load_gguf
from engine.models.hf_loader import load_hf
from engine.models.llama import LlamaModel
from engine.models.locate import resolve_model_path
from engine.tokenizer import Tokenizer

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class LoadedModel:
    path: Path
    model: LlamaModel
    tokenizer: Tokenizer
    load_s: float

    @property
    def name(self) -> str:
        return self.path.stem if self.path.is_file() else self.path.name


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise InvalidRequest(f"dtype '{name}' is not supported; use one of {sorted(set(DTYPES))}")
    return DTYPES[name]


def default_dtype(device: str) -> str:
    """The `--dtype auto` choice: bf16 on CUDA (half the weight bytes read per decode step,
    tensor cores), fp32 on the CPU (faster than bf16 without AMX)."""
    return "bf16" if device.startswith("cuda") else "fp32"


def place_model(loaded: LoadedModel, device: str) -> LoadedModel:
    """`loaded` with its weights on `device` ("cpu", "cuda", "cuda:N"), in the dtype they were
    loaded in. Raises `InvalidRequest` for an unknown device or CUDA that is not available."""
    try:
        target = torch.device(device)
    except RuntimeError as exc:
        raise InvalidRequest(f"device '{device}' is not a torch device: {exc}") from exc
    if target.type not in ("cpu", "cuda"):
        raise InvalidRequest(f"device '{device}' is not supported; use cpu or cuda")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequest(f"device '{device}' was asked for but CUDA is not available")
    current = loaded.model.device
    if current.type == target.type and (target.index is None or current.index == target.index):
        return loaded
    return replace(loaded, model=loaded.model.to(target))


def load_model(model: str | None = None, dtype: str = "fp32", *,
               show_progress: bool = True) -> LoadedModel:
    """Load `model` (None: the embedded SmolLM2 GGUF; a .gguf file; or an HF folder) on the CPU.

    Progress goes to stderr. Raises `ModelNotFound` (with an install hint) or `UnsupportedModel`.
    """
    path = resolve_model_path(model)
    torch_dtype = parse_dtype(dtype)
    started = time.perf_counter()
    if show_progress:
        print(f"radixgate: loading {path} ({dtype})", file=sys.stderr, flush=True)
    if path.is_file():
        config, weights = load_gguf(path, torch_dtype, show_progress=show_progress)
        tokenizer = Tokenizer.from_gguf(path)
    else:
        config, weights = load_hf(path, torch_dtype, show_progress=show_progress)
        tokenizer = Tokenizer.from_tokenizer_json(path / "tokenizer.json")
    loaded = LoadedModel(path, LlamaModel(config, weights, torch_dtype), tokenizer,
                         time.perf_counter() - started)
    if show_progress:
        print(f"radixgate: model ready in {loaded.load_s:.1f} s", file=sys.stderr, flush=True)
    return loaded
