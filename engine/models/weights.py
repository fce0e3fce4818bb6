"""A decoder's weights, and the alternative forms the CPU forwards read them in.

Every family fills the same structures (q/k/v and gate/up fused for one GEMM each); fields a
family does not use stay None. A projection, the embedding and the lm_head are dense tensors or
the GGUF file's own codes (`GgmlWeight`). `PackedWeights` and `MixedPrecision` describe the forms
the CPU forwards read (oneDNN copies, bf16 copies of dense projections).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from engine.models.ggml_weight import GgmlWeight, Table
from engine.models.linear import Weight


@dataclass
class MoEWeights:
    """A sparse MLP's router and experts, dense: experts' gate and up fused as in a dense MLP.
    The expert tensors may hold a contiguous run of the experts only, from `first_expert` on (a
    tensor-parallel rank's share, engine.tp.shard); the router always scores every expert."""

    router: torch.Tensor  # (num_experts, hidden)
    gate_up: torch.Tensor  # (held experts, 2 * intermediate, hidden): gate rows, then up rows
    down: torch.Tensor  # (held experts, hidden, intermediate)
    router_bias: torch.Tensor | None = None  # (num_experts,)
    gate_up_bias: torch.Tensor | None = None  # (held experts, 2 * intermediate)
    down_bias: torch.Tensor | None = None  # (held experts, hidden)
    first_expert: int = 0  # the global id of gate_up[0]

    def to(self, device: torch.device | str) -> MoEWeights:
        return MoEWeights(**{f.name: _move(getattr(self, f.name), device)
                             for f in fields(MoEWeights)})


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # (hidden,)
    qkv: Weight  # (q_size + 2 * kv_size, hidden): q, k, v projections fused into one GEMM
    qkv_bias: torch.Tensor | None
    o: Weight  # (hidden, q_size)
    ffn_norm: torch.Tensor
    gate_up: Weight | None  # (2 * intermediate, hidden): gate and up fused; None on MoE layers
    down: Weight | None  # (hidden, intermediate)
    o_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # (head_dim,), per-head RMSNorm before rotary
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None  # on the attention output (sandwich norms)
    post_ffn_norm: torch.Tensor | None = None
    sinks: torch.Tensor | None = None  # (num_heads,) fp32
    moe: MoEWeights | None = None

    def to(self, device: torch.device | str) -> LayerWeights:
        moved = {f.name: _move(getattr(self, f.name), device) for f in fields(LayerWeights)
                 if f.name != "moe"}
        return LayerWeights(**moved, moe=self.moe.to(device) if self.moe else None)


@dataclass
class ModelWeights:
    embed: Table  # (vocab, hidden): dense, or the GGUF's codes (rows gathered)
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: Table  # (vocab, hidden); the same object as `embed` when tied

    def to(self, device: torch.device | str) -> ModelWeights:
        """Every tensor on `device`; a tied lm_head stays the embedding's tensor. Codes
        (GgmlWeight) run on the CPU only: move a model with codes only to the CPU."""
        embed = _move(self.embed, device)
        lm_head = embed if self.lm_head is self.embed else _move(self.lm_head, device)
        return ModelWeights(embed, [layer.to(device) for layer in self.layers],
                            self.norm.to(device), lm_head)


def _move(value: Any, device: torch.device | str) -> Any:
    """A tensor on `device`; anything else (None, packed forms, which stay on the CPU) as is."""
    return value.to(device) if isinstance(value, torch.Tensor) else value


@dataclass(frozen=True)
class MixedPrecision:
    """Forwards of at least `min_rows` rows run their linear layers in `dtype`; smaller ones run
    them in the model's dtype (with the default min_rows of 1, every forward uses `dtype`).
    Norms, rotary and the residual stream stay in the model's dtype; the KV pool is in `dtype`
    when `kv` (else the model's), one pool that every step reads and writes, and attention
    computes its GEMMs in the pool's dtype. GGUF codes keep their own path whatever `dtype`
    says. `min_rows` is where the lower-precision GEMM starts to win
    on the CPU (benchmarks/model_speed.py measures it)."""

    dtype: torch.dtype = torch.bfloat16
    # The KV pool in `dtype` too, so extend attention runs its GEMMs in `dtype` (decode
    # attention reads half the bytes and accumulates in fp32). K and V come out of `dtype`
    # projections, so storing them in `dtype` rounds only the rotated keys once more.
    kv: bool = True
    # 1: decode too. With bf16 dot-product instructions a bf16 projection reads half the bytes
    # and is faster even for one row (engine decode 64-90 vs 49-71 tok/s fp32 on an AVX512-BF16
    # CPU; min_rows 8, fp32 decode, was no faster than fp32).
    min_rows: int = 1
    # The lm_head in `dtype` too (for every step): the largest single weight read per decode
    # step, so the biggest bandwidth saving, and the one that moves logits the most.
    lm_head: bool = False


@dataclass(frozen=True)
class PackedWeights:
    """What the CPU forwards read (through the C row ops): forwards of at most `max_rows` rows
    (decodes, draft verifications) take `decode_layers` and `lm_head`, longer ones (prefill
    chunks) `extend_layers` (None: the decode layers). GGUF codes (`GgmlWeight`) give a row the
    same bits in any forward, so a model whose projections are all codes takes one path for
    every row (`max_rows` unbounded); dense fp32 projections decode as they are and extend on
    copies in oneDNN's blocked layout (engine.models.onednn)."""

    decode_layers: tuple[LayerWeights, ...]
    lm_head: Table
    # Where dense decodes hand over to oneDNN's extends.
    max_rows: int = 16
    extend_layers: tuple[LayerWeights, ...] | None = None

    def codes(self) -> list[GgmlWeight]:
        weights = [w for layer in self.decode_layers for w in projections(layer)]
        return [w for w in [*weights, self.lm_head] if isinstance(w, GgmlWeight)]

    @property
    def nbytes(self) -> int:
        """Bytes of the GGUF codes read (dense tensors and oneDNN copies not counted)."""
        return sum(w.nbytes for w in self.codes())

    @property
    def name(self) -> str:
        codes = self.codes()
        if codes:
            types = "+".join(dict.fromkeys(t for w in codes for t in w.type_names.split("+")))
            path = "int8" if codes[0].int8 else "fp32"
            return f"gguf codes ({types}) on the {path} path"
        return f"dense decodes, {'dense' if self.extend_layers is None else 'onednn'} extends"


def projections(layer: LayerWeights) -> list[Weight]:
    """The layer's dense-MLP and attention projections (what packing may replace)."""
    return [w for w in (layer.qkv, layer.o, layer.gate_up, layer.down) if w is not None]


def with_projections(layer: LayerWeights, convert: Callable[[Weight], Weight]) -> LayerWeights:
    """`layer` with each projection replaced by `convert(weight)`; norms, biases and experts are
    shared, not copied."""
    return replace(layer, qkv=convert(layer.qkv), o=convert(layer.o),
                   gate_up=None if layer.gate_up is None else convert(layer.gate_up),
                   down=None if layer.down is None else convert(layer.down))
