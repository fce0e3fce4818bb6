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
from engine.models import onednn, quant
from engine.models.decoder import DecoderModel
from engine.models.gguf_loader import load_gguf
from engine.models.hf_loader import load_hf
from engine.models.locate import resolve_model_path
from engine.models.weights import LayerWeights, MixedPrecision, PackedWeights, with_projections
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16}
# "mixed": fp32 weights, norms, attention and KV pool, with the projections (not the lm_head)
# run in bf16 (see MixedPrecision).
MIXED = "mixed"
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
    """The weight dtype of a `--dtype` name ("mixed" keeps fp32 weights)."""
    if name == MIXED:
        return torch.float32
    if name not in DTYPES:
        raise InvalidRequest(
            f"dtype '{name}' is not supported; use one of {sorted({*DTYPES, MIXED})}")
    return DTYPES[name]


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags, less those above `RADIXGATE_MAX_CPU_ISA` (`engine.cpu_isa`);
    empty where they cannot be read (not Linux)."""
    return cpu_isa.flags(cpuinfo)


def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX512-BF16 or AMX); False where the
    flags cannot be read (not Linux)."""
    return not cpu_flags(cpuinfo).isdisjoint(BF16_CPU_FLAGS)


def default_dtype(device: str, cpu_bf16: bool | None = None) -> str:
    """The `--dtype auto` choice: bf16 on CUDA (half the weight bytes read per decode step,
    tensor cores); mixed on a CPU with bf16 instructions (its bf16 GEMMs are 2.3x faster than
    fp32 at prefill sizes and read half the bytes at decode, while fp32 norms, attention and
    KV keep greedy output near fp32's); fp32 on other CPUs."""
    if device.startswith("cuda"):
        return "bf16"
    if cpu_bf16 is None:
        return cpu_isa.auto_dtype()[1].dtype
    return MIXED if cpu_bf16 else "fp32"


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
    """Load `model` (None: the embedded SmolLM2 GGUF; a .gguf file; or an HF folder) on the CPU.

    `packed`: decode steps of a GGUF with Q4_0/Q4_1/Q8_0/Q4_K weights read those codes
    (engine.models.quant) where the kernel is built, fp32 extends read oneDNN-packed copies of
    the dense weights (engine.models.onednn), and the forwards run the C row ops; False keeps the
    dense torch reference path.
    Progress goes to stderr. Raises `ModelNotFound` (with an install hint) or `UnsupportedModel`.
    """
    path = resolve_model_path(model)
    torch_dtype = parse_dtype(dtype)
    started = time.perf_counter()
    if show_progress:
        print(f"radixgate: loading {path} ({dtype})", file=sys.stderr, flush=True)
    # The codes kernel computes in fp32: a bf16 model keeps its own decode path.
    want_packed = packed and torch_dtype == torch.float32 and quant.kernel() is not None
    packed_weights = None
    if path.is_file():
        config, weights, packed_weights = load_gguf(path, torch_dtype, packed=want_packed,
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
    if want_packed and packed_weights is None:
        # No codes the kernel reads (an HF folder, an F16 GGUF): decodes keep the dense
        # weights, extends and the row ops still take the packed path.
        packed_weights = PackedWeights(tuple(weights.layers), weights.lm_head)
    mixed = MixedPrecision() if dtype == MIXED else None
    # With mixed precision the extends run bf16 copies instead.
    if packed_weights is not None and mixed is None and onednn.available():
        packed_weights = replace(packed_weights, extend_layers=tuple(
            _onednn_layer(layer) for layer in weights.layers))
    model_ = DecoderModel(config, weights, torch_dtype, mixed, packed_weights)
    loaded = LoadedModel(path, model_, tokenizer, time.perf_counter() - started)
    if show_progress:
        print(f"radixgate: model ready in {loaded.load_s:.1f} s ({model_.precision_name}; "
              f"weights: {model_.weights_name})", file=sys.stderr, flush=True)
    return loaded


def _onednn_layer(layer: LayerWeights) -> LayerWeights:
    """`layer` with its dense fp32 projections in oneDNN's layout (experts stay dense)."""
    def pack(weight: object) -> onednn.OneDnnWeight:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"only dense weights are packed, got {type(weight).__name__}")
        return onednn.OneDnnWeight.pack(weight)

    return with_projections(layer, pack)
