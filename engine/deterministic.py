"""`--deterministic`: every forward takes the path a decode takes, so the logits of a token do
not depend on how its prefix was computed (cached, recomputed, chunked, batched, drafted).

The default CPU mode computes decodes and prefill chunks differently for the projections, each
at its fastest: the GGUF codes kernel against oneDNN GEMMs, whose summation order depends on
how many rows came together. So the KV of a reply computed by decoding differs in its last bits
from the same KV recomputed by a prefill, and a near-tie can flip a later token. Here every row
goes through the decode path: the codes kernel (per row, one summation order) and the C row
ops. Attention is already invariant in the default "cpu" backend where that costs at most 5%
(csrc/row_math.h, cpu_extend.extend_choice); `InvariantCpuAttention` makes it so everywhere
(also with AMX tiles for a bf16 pool and on builds without AVX2). Prefill is slower; decode is
unchanged.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import replace

import torch

from engine.attention.base import PagedAttentionBackend
from engine.errors import InvalidRequest
from engine.models.loader import LoadedModel
from engine.models.weights import PackedWeights

logger = logging.getLogger(__name__)


def dense_projections(packed: PackedWeights) -> list[str]:
    """The decode path's projections that are dense tensors (not GGUF codes: a type the codes
    kernel does not read, or MoE experts): torch runs them, in an order that may change with
    the number of rows."""
    dense = []
    for i, layer in enumerate(packed.decode_layers):
        for name in ("qkv", "o", "gate_up", "down"):
            if isinstance(getattr(layer, name), torch.Tensor):
                dense.append(f"layer {i} {name}")
        if layer.moe is not None:
            dense.append(f"layer {i} experts")
    if isinstance(packed.lm_head, torch.Tensor):
        dense.append("lm_head")
    return dense


def deterministic_setup(loaded: LoadedModel, device: str
                        ) -> tuple[LoadedModel, type[PagedAttentionBackend]]:
    """`loaded` with every forward on its decode weights, and the attention backend for it.
    Raises `InvalidRequest` where the decode path cannot take every row."""
    from engine.attention.cpu_invariant import InvariantCpuAttention
    from engine.attention.cpu_paged import kernel
    from engine.models import rowops

    model = loaded.model
    if device != "cpu":
        raise InvalidRequest("--deterministic runs on the CPU kernels; drop --device or "
                             "--deterministic")
    packed = model.packed
    if not isinstance(packed, PackedWeights) or kernel() is None or rowops.kernel() is None:
        raise InvalidRequest("--deterministic needs packed weights and the compiled kernels; "
                             "drop --no-packed-weights, or reinstall with a C compiler")
    dense = dense_projections(packed)
    if dense:
        logger.warning("--deterministic: %d projections are dense (%s%s) and run torch's GEMM, "
                       "whose summation order may change with the number of rows; only the "
                       "rest is batch-invariant", len(dense), ", ".join(dense[:3]),
                       ", ..." if len(dense) > 3 else "")
    whole = replace(packed, max_rows=sys.maxsize)
    return replace(loaded, model=model.with_packed(whole)), InvariantCpuAttention
