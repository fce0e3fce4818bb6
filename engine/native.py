"""The compiled C/OpenMP extensions (setup.py builds them with the package): one way to load
them, so every caller degrades the same way where the install had no C compiler."""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

import torch

logger = logging.getLogger(__name__)


def load_extension(module: str, instead: str) -> ModuleType | None:
    """The extension `module`, or None where it was not built; then logs a warning that says
    how to build it and what runs `instead`. Callers cache the result."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        logger.warning("%s is not built (%s); reinstall with a C compiler (pip install -e .) to "
                       "use it. %s", module, exc, instead)
        return None


def require(ext: ModuleType | None, what: str) -> ModuleType:
    """`ext`, or a RuntimeError saying that `what` needs the built extension."""
    if ext is None:
        raise RuntimeError(f"{what} needs its compiled extension; reinstall radixgate with a C "
                           "compiler (pip install -e .)")
    return ext


def check_buffer(t: torch.Tensor, what: str, dtypes: tuple[torch.dtype, ...],
                 shape: tuple[int, ...] | None = None) -> None:
    """The checks a tensor passes before its raw pointer goes to C: on the CPU, contiguous, of
    one of `dtypes` and of `shape` (where given). Raises TypeError or ValueError naming it.
    Decode steps make hundreds of these calls, so the passing case is one cheap expression."""
    if t.dtype in dtypes and t.is_cpu and t.is_contiguous() and (shape is None
                                                                  or t.shape == shape):
        return
    if t.dtype not in dtypes:
        raise TypeError(f"{what} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"{what} must be on the CPU, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous (strides {t.stride()})")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{what} must have shape {list(shape)}, got {list(t.shape)}")


# The extensions whose SIMD path depends on how they were built, by what they compute.
SIMD_EXTENSIONS = (("attention", "engine.attention._paged_cpu"),
                   ("extend attention", "engine.attention._extend_cpu"),
                   ("int8 gemv", "engine.models._ggml_vec"),
                   ("int8 gemm", "engine.models._ggml_gemm"),
                   ("fp32 codes", "engine.models._ggml_f32"))


def kernel_simd() -> str:
    """Which SIMD path each built extension compiled, e.g. "attention avx512, projections
    avx512" ("not built" for one that is missing)."""
    parts = []
    for what, module in SIMD_EXTENSIONS:
        try:
            parts.append(f"{what} {importlib.import_module(module).simd()}")
        except ImportError:
            parts.append(f"{what} not built")
    return ", ".join(parts)
