"""Attention backends by name, imported lazily so optional ones cost nothing when unused."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from engine.attention.triton_select import choose_auto_backend, register_gpu_backends
from engine.errors import InvalidRequest

if TYPE_CHECKING:
    from engine.attention.base import PagedAttentionBackend
    from engine.attention.spec import AttentionSpec

logger = logging.getLogger(__name__)


def _torch() -> type[PagedAttentionBackend]:
    from engine.attention.torch_paged import TorchPagedAttention

    return TorchPagedAttention


def _torch_sdpa() -> type[PagedAttentionBackend]:
    from engine.attention.torch_paged import TorchSdpaPagedAttention

    return TorchSdpaPagedAttention


def _cpu() -> type[PagedAttentionBackend]:
    from engine.attention.cpu_paged import CpuPagedAttention

    return CpuPagedAttention


BACKENDS: dict[str, Callable[[], type[PagedAttentionBackend]]] = {
    "torch": _torch, "torch_sdpa": _torch_sdpa, "cpu": _cpu}
register_gpu_backends(BACKENDS)  # "triton", "flash_attn" and "auto", all imported lazily
# What "auto" falls back to when its first choice cannot run a model's layers: the torch
# backend computes every feature (the fast paths where it has them, else the reference math).
FALLBACK = "torch"


def get_backend(name: str) -> type[PagedAttentionBackend]:
    if name not in BACKENDS:
        raise InvalidRequest(
            f"attention backend '{name}' is unknown; choose from {sorted(BACKENDS)}")
    return BACKENDS[name]()


def unsupported_by(backend: type[PagedAttentionBackend],
                   specs: Sequence[AttentionSpec]) -> list[str]:
    """Sorted "layer N: feature" entries `backend` refuses among `specs`."""
    return sorted({f"layer {spec.layer_idx}: {what}" for spec in specs
                   for what in backend.unsupported(spec)})


def backend_for(name: str, specs: Sequence[AttentionSpec]) -> type[PagedAttentionBackend]:
    """The backend `name` names, checked against every layer's spec. "auto" takes the machine's
    choice when it can run every layer, else the torch backend (logged). A backend named
    explicitly that cannot run some layer is an `InvalidRequest` that says what it lacks."""
    if name == "auto":
        chosen = choose_auto_backend()
        backend = get_backend(chosen)
        refused = unsupported_by(backend, specs)
        if not refused:
            return backend
        logger.info("attention backend auto -> %s: %s cannot run %s", FALLBACK, chosen,
                    "; ".join(refused[:4]))
        name = FALLBACK
    backend = get_backend(name)
    refused = unsupported_by(backend, specs)
    if refused:
        raise InvalidRequest(
            f"attention backend '{name}' cannot run this model ({'; '.join(refused[:4])}); "
            f"use --attention-backend auto or {FALLBACK}")
    return backend
