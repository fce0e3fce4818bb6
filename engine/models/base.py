"""The model interface the engine, the runner, the CUDA-graph path and the reference use.

Families (engine.models.families) fill in a config and a tensor map; every one of them runs as
an `engine.models.decoder.DecoderModel`, which is what implements this protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from engine.attention.spec import AttentionSpec
from engine.config import ModelConfig
from engine.models.weights import PackedWeights


class AttentionFn(Protocol):
    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        """q: (N, num_heads, head_dim); k, v: (N, num_kv_heads, head_dim) of the new tokens,
        rotary already applied; `spec`: the layer's attention (its index, scale, window,
        sinks). Returns (N, num_heads, head_dim). May store k/v (paged backends)."""
        ...


class Model(Protocol):
    config: ModelConfig
    dtype: torch.dtype
    device: torch.device
    attention_specs: tuple[AttentionSpec, ...]  # one per layer, in order

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype of the KV pool an engine builds for this model."""
        ...

    @property
    def precision_name(self) -> str: ...

    @property
    def weights_name(self) -> str: ...

    def to(self, device: torch.device | str) -> Model: ...

    def with_packed(self, packed: PackedWeights | None) -> Model:
        """The same weights with forwards on `packed` (None: the dense reference)."""
        ...

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: AttentionFn) -> torch.Tensor:
        """input_ids, positions: int64 (N,) -> final-normed hidden states (N, hidden)."""
        ...

    @property
    def decode_max_rows(self) -> int | None:
        """The most rows a forward takes on the decode path unless told (None: one path for
        every forward)."""
        ...

    def forward_captured(self, input_ids: torch.Tensor, positions: torch.Tensor,
                         attention: AttentionFn, layers: Sequence[int],
                         decode_path: bool | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward`, and the residual streams entering `layers` side by side (N, k * hidden)
        from the same pass (None for no layers). `decode_path` True runs every row on the
        decode path (the one a single-row decode takes), False never, None by row count."""
        ...

    def logits(self, hidden: torch.Tensor, decode_path: bool | None = None) -> torch.Tensor:
        """(M, hidden) -> fp32 logits (M, vocab), on the decode path as `forward_captured`."""
        ...


def dtype_name(dtype: torch.dtype) -> str:
    """"fp32", "bf16", "fp16", or torch's name of another dtype."""
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    return names.get(dtype, str(dtype))
