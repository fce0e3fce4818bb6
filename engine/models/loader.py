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
from engine.models import int8_gemm, onednn, quant
from engine.models.decoder import DecoderModel
from engine.models.gguf_loader import load_gguf
from engine.models.hf_loader import load_hf
from engine.models.linear import Weight
from engine.models.locate import resolve_model_path
from engine.models.quant import PackedWeight
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
# "mixed": fp32 weights, norms, attention and KV pool, with the projections (not the lm_head)
# run in bf16 (see MixedPrecision).
MIXED = "mixed"
# "int8": fp32 weights, norms, attention and KV pool, with the projections of extends run as
# int8 GEMMs on the GGUF's codes (engine.models.int8_gemm; VNNI CPUs).
INT8 = "int8"
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


def default_dtype(device: str, cpu_bf16: bool | None = None) -> str:
    """The `--dtype auto` choice: bf16 on CUDA (half the weight bytes read per decode step,
    tensor cores); mixed on a CPU with bf16 instructions (its bf16 GEMMs are 2.3x faster than
    fp32 at prefill sizes and read half the bytes at decode, while fp32 norms, attention and
    KV keep greedy output near fp32's); fp32 on other CPUs."""
    if device.startswith("cuda"):
        return "bf16"
    if cpu_bf16 is None:
        return auto_cpu_dtype()[1].dtype
    return MIXED if cpu_bf16 else "fp32"


def auto_cpu_dtype() -> tuple[str, cpu_isa.DtypeChoice]:
    """(CPU class, `--dtype auto`'s choice on it, with its reason), fp32 where the class would
    take int8 but the int8 kernel was not built with VNNI."""
    name, choice = cpu_isa.auto_dtype()
    if choice.dtype == INT8 and not int8_gemm.has_vnni():
        return name, cpu_isa.DtypeChoice("fp32", f"the int8 kernel is not built with VNNI "
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
    """Load `model` (None: the embedded SmolLM2 GGUF; a .gguf file; or an HF folder) on the CPU.

    `packed`: decode steps of a GGUF with Q4_0/Q4_1/Q8_0/Q4_K weights read those codes
    (engine.models.quant) where the kernel is built, fp32 extends read oneDNN-packed copies of
    the dense weights (engine.models.onednn), or with `dtype` "int8" the codes as int8 GEMMs
    (engine.models.int8_gemm), and the forwards run the C row ops; False keeps the dense torch
    reference path.
    Progress goes to stderr. Raises `ModelNotFound` (with an install hint) or `UnsupportedModel`;
    `InvalidRequest` for "int8" on a CPU (or kernel build) without VNNI.
    """
    path = resolve_model_path(model)
    torch_dtype = parse_dtype(dtype)
    if dtype == INT8 and not int8_gemm.has_vnni():
        raise InvalidRequest("--dtype int8 needs a CPU with VNNI (AVX512-VNNI or AVX-VNNI) "
                             "and the int8 kernel "
                             f"built for it (built: {kernel_simd()}); use --dtype fp32")
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
    if packed_weights is not None and mixed is None and dtype == INT8:
        packed_weights = replace(packed_weights, extend_layers=tuple(
            int8_extend_layer(dense, codes)
            for dense, codes in zip(weights.layers, packed_weights.decode_layers, strict=True)))
        if not any(isinstance(w, int8_gemm.Int8Weight)
                   for layer in packed_weights.extend_layers or () for w in projections(layer)):
            logger.warning("--dtype int8: %s has no Q4_0/Q4_1/Q8_0/Q4_K projections; extends "
                           "run fp32", path.name)
    elif packed_weights is not None and mixed is None and onednn.available():
        packed_weights = replace(packed_weights, extend_layers=tuple(
            onednn_extend_layer(layer) for layer in weights.layers))
    model_ = DecoderModel(config, weights, torch_dtype, mixed, packed_weights)
    loaded = LoadedModel(path, model_, tokenizer, time.perf_counter() - started)
    if show_progress:
        print(f"radixgate: model ready in {loaded.load_s:.1f} s ({model_.precision_name}; "
              f"weights: {model_.weights_name})", file=sys.stderr, flush=True)
    return loaded


def int8_extend_layer(dense: LayerWeights, codes: LayerWeights) -> LayerWeights:
    """The extend weights of one layer for `--dtype int8`: each projection whose GGUF codes are
    packed (`codes`) as an int8 GEMM weight, the others dense fp32 in oneDNN's layout."""
    def convert(weight: Weight, fallback: Weight | None) -> Weight:
        if isinstance(weight, PackedWeight):
            int8 = int8_gemm.Int8Weight.from_packed(weight)
            if int8 is not None:
                return int8
        assert isinstance(fallback, torch.Tensor)
        return onednn.OneDnnWeight.pack(fallback) if onednn.available() else fallback

    assert codes.qkv is not None and codes.o is not None
    return replace(dense, qkv=convert(codes.qkv, dense.qkv), o=convert(codes.o, dense.o),
                   gate_up=None if codes.gate_up is None else convert(codes.gate_up,
                                                                      dense.gate_up),
                   down=None if codes.down is None else convert(codes.down, dense.down))


def onednn_extend_layer(layer: LayerWeights) -> LayerWeights:
    """`layer` with its dense fp32 projections in oneDNN's layout (experts stay dense)."""
    def pack(weight: object) -> onednn.OneDnnWeight:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"only dense weights are packed, got {type(weight).__name__}")
        return onednn.OneDnnWeight.pack(weight)

    return with_projections(layer, pack)
