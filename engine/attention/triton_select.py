"""Lazy registry factories for the GPU backends ("triton", "flash_attn") and the "auto" choice.

Nothing here imports triton or flash_attn until a backend is asked for by name.
"auto": flash_attn if it imports and CUDA is present, else triton on CUDA, else the "cpu"
kernel where it was built, else torch; the choice is logged once per process.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.errors import InvalidRequest

if TYPE_CHECKING:
    from engine.attention.base import PagedAttentionBackend

logger = logging.getLogger(__name__)

Factory = Callable[[], "type[PagedAttentionBackend]"]


def _triton() -> type[PagedAttentionBackend]:
    if importlib.util.find_spec("triton") is None:
        raise InvalidRequest("attention backend 'triton' needs the triton package")
    from engine.attention.triton_backend import TritonPagedAttention

    return TritonPagedAttention


def _flash_attn() -> type[PagedAttentionBackend]:
    try:
        from engine.attention.flash_attn_backend import FlashAttnBackend
    except ImportError as exc:
        raise InvalidRequest(f"attention backend 'flash_attn' is unavailable: {exc}") from exc
    return FlashAttnBackend


def flash_attn_available() -> bool:
    if not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def choose_auto_backend() -> str:
    """Name of the backend "auto" resolves to on this machine (logged on the first call)."""
    if flash_attn_available():
        name, why = "flash_attn", "flash_attn imports and CUDA is present"
    elif torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
        name, why = "triton", "CUDA is present, flash_attn is not"
    else:
        from engine.attention.cpu_paged import kernel

        name, why = ("cpu", "no CUDA device, the CPU kernel is built") if kernel() is not None \
            else ("torch", "no CUDA device, the CPU kernel is not built")
    logger.info("attention backend auto -> %s (%s)", name, why)
    return name


def register_gpu_backends(backends: dict[str, Factory]) -> None:
    def _auto() -> type[PagedAttentionBackend]:
        return backends[choose_auto_backend()]()

    backends["triton"] = _triton
    backends["flash_attn"] = _flash_attn
    backends["auto"] = _auto
