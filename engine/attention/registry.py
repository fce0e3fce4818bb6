"""Attention backends by name, imported lazily so optional ones cost nothing when unused."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.attention.triton_select import register_gpu_backends
from engine.errors import InvalidRequest

if TYPE_CHECKING:
    from engine.attention.base import PagedAttentionBackend


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


def get_backend(name: str) -> type[PagedAttentionBackend]:
    if name not in BACKENDS:
        raise InvalidRequest(
            f"attention backend '{name}' is unknown; choose from {sorted(BACKENDS)}")
    return BACKENDS[name]()
