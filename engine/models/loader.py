"""One entry point for loading a model with its tokenizer, whatever the checkpoint format."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine import cpu_isa
from engine.errors import InvalidRequest
from engine.models import ggml_weight, onednn
from engine.models.decoder import DecoderModel
from engine.models.ggml_weight import GgmlWeight
from engine.models.gguf_loader import load_gguf
from engine.models.hf_loader import load_hf
from engine.models.linear import Weight
from engine.models.locate import resolve_model_path
from engine.models.weights import (
    LayerWeights,
    MixedPrecision,
    PackedWeights,
    projections,
    with_projections,
)
from engine.native import kernel_simd
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16}
# "mixed": GGUF codes on the int8 path (engine.models.ggml_weight), dense projections (not the
# lm_head) in bf16, the KV pool in bf16 (see MixedPrecision); norms and residuals fp32.
MIXED = "mixed"
# "int8": GGUF codes on the int8 path; everything else fp32 (dense projections, KV pool).
INT8 = "int8"
# "fp32" runs GGUF codes on the fp32 path: the exact dequantised weights times fp32 rows.
# CPU flags with bf16 dot-product instructions; without them bf16 GEMMs are slower than fp32.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class LoadedModel:
    path: Path
    model: DecoderModel
    tokenizer: Tokenizer
    load_s: float

    @property
    def name(self) -> str:
        return self.path.stem if self.path.is_file() else self.path.name


def parse_dtype(name: str) -> torch.dtype:
    """The weight dtype of a `--dtype` name ("mixed" and "int8" keep fp32 weights)."""
    if name in (MIXED, INT8):
        return torch.float32
    if name not in DTYPES:
        raise InvalidRequest(
            f"dtype '{name}' is not supported; use one of {sorted({*DTYPES, MIXED, INT8})}")
    return DTYPES[name]


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags, less those above `RADIXGATE_MAX_CPU_ISA` (`engine.cpu_isa`);
    empty where they cannot be read (not Linux)."""
    return cpu_isa.flags(cpuinfo)


def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX512-BF16 or AMX); False where the
    flags cannot be read (not Linux)."""
    return not cpu_flags(cpuinfo).isdisjoint(BF16_CPU_FLAGS)


def default_dtype(device: str) -> str:
    """The `--dtype auto` choice: bf16 on CUDA (half the weight bytes read per decode step,
    tensor cores); on a CPU, GGUF codes on the int8 path with everything else fp32 ("int8"),
    or "fp32" where the int8 kernels were not built (`engine.cpu_isa` holds the reasons)."""
    if device.startswith("cuda"):
        return "bf16"
    return auto_cpu_dtype()[1].dtype


def auto_cpu_dtype() -> tuple[str, cpu_isa.DtypeChoice]:
    """(CPU class, `--dtype auto`'s choice on it, with its reason), fp32 where the int8 path's
    kernels were not built."""
    name, choice = cpu_isa.auto_dtype()
    if choice.dtype in (INT8, MIXED) and not ggml_weight.kernels_built(int8=True):
        return name, cpu_isa.DtypeChoice("fp32", f"the int8 GGUF kernels are not built "
                                                 f"({kernel_simd()})")
    return name, choice


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
               show_progress: bool = True, packed: bool = True) -> LoadedModel:
    """Load `model` (None: `locate.default_model()`; a name, a .gguf file, or an HF folder) on
    the CPU.

    `packed` (the served path): a GGUF's quantised projections, embedding and lm_head are read
    from its own codes through its memory map (engine.models.ggml_weight: the int8 path, or
    the fp32 path for `dtype` "fp32"), dense fp32 projections run oneDNN-packed copies for
    extends (engine.models.onednn), and the forwards run the C row ops. False keeps the dense
    torch reference path (every tensor dequantised).
    Progress goes to stderr. Raises `ModelNotFound` (with an install hint) or `UnsupportedModel`.
    """
    path = resolve_model_path(model)
    torch_dtype = parse_dtype(dtype)
    started = time.perf_counter()
    if show_progress:
        print(f"radixgate: loading {path} ({dtype})", file=sys.stderr, flush=True)
    # The CPU kernels compute in fp32 (codes: int8 rows with fp32 scales): a bf16 model keeps
    # the torch path.
    fast = packed and torch_dtype == torch.float32
    int8 = dtype != "fp32"
    codes = fast and ggml_weight.kernels_built(int8)
    if path.is_file():
        config, weights = load_gguf(path, torch_dtype, codes=codes, int8=int8,
                                    show_progress=show_progress)
        tokenizer = Tokenizer.from_gguf(path)
    else:
        config, weights = load_hf(path, torch_dtype, show_progress=show_progress)
        tokenizer = Tokenizer.from_tokenizer_json(path / "tokenizer.json")
    if tokenizer.default_template_family is not None:
        note = (f"{path.name} has no chat template; using the {tokenizer.default_template_family} "
                "turn format")
        logger.info(note)
        if show_progress:
            print(f"radixgate: {note}", file=sys.stderr, flush=True)
    mixed = MixedPrecision() if dtype == MIXED else None
    packed_weights = None
    if fast:
        # Codes give a row the same bits in every forward: one path for all rows. Dense
        # projections keep the decode path (dense fp32) apart from the extends' oneDNN copies.
        uniform = all(isinstance(w, GgmlWeight) for layer in weights.layers
                      for w in projections(layer)) and isinstance(weights.lm_head, GgmlWeight)
        packed_weights = PackedWeights(tuple(weights.layers), weights.lm_head,
                                       max_rows=sys.maxsize if uniform else PackedWeights.max_rows)
        if mixed is None and not uniform and onednn.available():
            packed_weights = replace(packed_weights, extend_layers=tuple(
                onednn_extend_layer(layer) for layer in weights.layers))
    model_ = DecoderModel(config, weights, torch_dtype, mixed, packed_weights)
    loaded = LoadedModel(path, model_, tokenizer, time.perf_counter() - started)
    if show_progress:
        print(f"radixgate: model ready in {loaded.load_s:.1f} s ({model_.precision_name}; "
              f"weights: {model_.weights_name})", file=sys.stderr, flush=True)
    return loaded


def onednn_extend_layer(layer: LayerWeights) -> LayerWeights:
    """`layer` with its dense fp32 projections in oneDNN's layout (experts stay dense)."""
    def pack(weight: Weight) -> Weight:
        if isinstance(weight, GgmlWeight):
            return weight  # read from its codes on every path
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"only dense weights are packed, got {type(weight).__name__}")
        return onednn.OneDnnWeight.pack(weight)

    return with_projections(layer, pack)
