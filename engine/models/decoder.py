"""The decoder every family runs: one layer, written once over `Ops`, and the model around it.

The forward takes every scheduled token of every sequence as one row of a `[num_tokens, hidden]`
matrix: decode tokens and prefill chunks alike. Only attention needs to know which rows belong
to which sequence, so attention is injected (`AttentionFn`): the dense reference attends within
the batch, the paged backends attend over the KV pool. Families differ only in what their
config turns on (engine.config.ModelConfig): q/k norms, sandwich norms, biases, the gate's
activation, experts, windows, sinks and rotary per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from engine.attention.spec import AttentionSpec
from engine.config import ModelConfig, Rope
from engine.models import onednn, rowops
from engine.models.base import AttentionFn, dtype_name
from engine.models.ggml_weight import GgmlWeight, embedding
from engine.models.linear import Weight, linear
from engine.models.moe import moe_forward
from engine.models.onednn import OneDnnWeight
from engine.models.ops import CPU_OPS, TORCH_OPS, TorchOps
from engine.models.rope import rotary_tables
from engine.models.weights import (
    LayerWeights,
    MixedPrecision,
    ModelWeights,
    PackedWeights,
    with_projections,
)

# Sums a tensor-parallel rank's partial output over the ranks (engine.tp), returning the sum
# (possibly the same tensor, summed in place).
Reduce = Callable[[torch.Tensor], torch.Tensor]


def row_dtype(weight: Weight) -> torch.dtype:
    """The dtype a projection computes in, which its input rows are kept in."""
    if isinstance(weight, OneDnnWeight):
        return weight.packed.dtype
    if isinstance(weight, GgmlWeight):
        return torch.float32
    return weight.dtype


def decoder_layer(ops: TorchOps, cfg: ModelConfig, layer: LayerWeights, lin: LayerWeights,
                  spec: AttentionSpec, x: torch.Tensor, positions: torch.Tensor,
                  rotary: tuple[torch.Tensor, torch.Tensor], attention: AttentionFn,
                  reduce: Reduce | None = None) -> None:
    """One pre-norm decoder layer, updating the residual stream `x` (N, hidden) in place.
    `layer` holds the norms, biases and experts; `lin` the projections in the form this forward
    reads (dense, packed codes or oneDNN layout: the same values). With `reduce` (a
    tensor-parallel shard: `cfg` counts this rank's heads and intermediate units) the o and
    down projections' partial outputs are summed over the ranks, once per attention block and
    once per MLP block, before o's bias, the sandwich norms and the residual add."""
    eps, num_tokens = cfg.rms_norm_eps, x.shape[0]
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    rows = row_dtype(lin.qkv)
    qkv = linear(ops.rms_norm(x, layer.attn_norm, eps, rows), lin.qkv, lin.qkv_bias)
    if layer.q_norm is not None and layer.k_norm is not None:
        ops.head_norm_(qkv, layer.q_norm, 0, nh, hd, eps)
        ops.head_norm_(qkv, layer.k_norm, nh, nkv, hd, eps)
    ops.rotary_(qkv, nh + nkv, hd, positions, *rotary)
    q, k, v = torch.split(qkv, [cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
    attn = attention(spec, q.view(num_tokens, nh, hd), k.view(num_tokens, nkv, hd),
                     v.view(num_tokens, nkv, hd)).reshape(num_tokens, cfg.q_size).to(rows)
    if reduce is not None:
        out = reduce(linear(attn, lin.o))
        if layer.o_bias is not None:  # added once, after the sum
            out = out + layer.o_bias
        x.add_(out if layer.post_attn_norm is None
               else ops.rms_norm(out, layer.post_attn_norm, eps, x.dtype))
    elif layer.post_attn_norm is None:
        ops.add_linear_(x, attn, lin.o, layer.o_bias)
    else:
        out = linear(attn, lin.o, layer.o_bias)
        x.add_(ops.rms_norm(out, layer.post_attn_norm, eps, x.dtype))
    h = ops.rms_norm(x, layer.ffn_norm, eps, rows)
    if layer.moe is not None:
        assert cfg.moe is not None
        mlp = moe_forward(h, layer.moe, cfg.moe)
        if reduce is not None:
            mlp = reduce(mlp)
        if layer.post_ffn_norm is not None:
            mlp = ops.rms_norm(mlp, layer.post_ffn_norm, eps, x.dtype)
        x.add_(mlp)
        return
    assert lin.gate_up is not None and lin.down is not None
    gated = ops.gate_mul(linear(h, lin.gate_up), cfg.activation)
    if reduce is not None:
        down = reduce(linear(gated, lin.down))
        x.add_(down if layer.post_ffn_norm is None
               else ops.rms_norm(down, layer.post_ffn_norm, eps, x.dtype))
    elif layer.post_ffn_norm is None:
        ops.add_linear_(x, gated, lin.down)
    else:
        x.add_(ops.rms_norm(linear(gated, lin.down), layer.post_ffn_norm, eps, x.dtype))


class DecoderModel:
    """Weights plus the forward pass. Stateless across calls: all KV state lives in the backend.
    The one implementation of `engine.models.base.Model`. With `reduce`, one tensor-parallel
    rank's shard (engine.tp.shard): `config` and the weights are the rank's part."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, dtype: torch.dtype,
                 mixed: MixedPrecision | None = None, packed: PackedWeights | None = None,
                 reduce: Reduce | None = None) -> None:
        self.config = config
        self.reduce = reduce
        self.weights = weights
        self.dtype = dtype
        self.device = weights.norm.device
        self.mixed = mixed
        # The packing kernels run on the CPU, in fp32; a model moved to CUDA drops them.
        self.packed = packed if self.device.type == "cpu" and dtype == torch.float32 else None
        # Copies of the linear weights in the extend dtype; the fp32 ones remain for decode.
        # With packed weights they are packed too (oneDNN's layout, which AMX reads fastest).
        self._extend_layers = ([_cast_linears(layer, mixed.dtype, pack=self.packed is not None)
                                for layer in weights.layers]
                               if mixed is not None and mixed.dtype != dtype else None)
        self._lm_head = (weights.lm_head.to(mixed.dtype)
                         if mixed is not None and mixed.lm_head
                         and isinstance(weights.lm_head, torch.Tensor) else weights.lm_head)
        self.attention_specs = tuple(
            AttentionSpec(i, config.attention_scale, config.layer_window(i),
                          None if layer.sinks is None else layer.sinks.float())
            for i, layer in enumerate(weights.layers))
        # One table per distinct rotary (Gemma 3's local and global layers differ), built on
        # the CPU (exact angles), then moved next to the weights they rotate.
        ropes = [config.layer_rope(i) for i in range(config.num_layers)]
        tables: dict[Rope, tuple[torch.Tensor, torch.Tensor]] = {}
        for rope in ropes:
            if rope not in tables:
                cos, sin = rotary_tables(rope, config.head_dim, config.max_position_embeddings,
                                         torch.float32)
                tables[rope] = (cos.to(self.device), sin.to(self.device))
        self._rotary = [tables[rope] for rope in ropes]

    def to(self, device: torch.device | str) -> DecoderModel:
        """A model with every weight on `device` (this one is unchanged); a tied lm_head stays
        the same tensor as the embedding, so tying costs no extra device memory."""
        return DecoderModel(self.config, self.weights.to(device), self.dtype, self.mixed,
                            self.packed, self.reduce)

    def with_mixed_precision(self, mixed: MixedPrecision | None) -> DecoderModel:
        """The same weights with extends in `mixed.dtype` (None: every step in `self.dtype`)."""
        return DecoderModel(self.config, self.weights, self.dtype, mixed, self.packed,
                            self.reduce)

    def with_packed(self, packed: PackedWeights | None) -> DecoderModel:
        """The same weights with forwards on `packed` (None: the dense reference)."""
        return DecoderModel(self.config, self.weights, self.dtype, self.mixed, packed,
                            self.reduce)

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype of the KV pool an engine builds for this model."""
        return self.mixed.dtype if self.mixed is not None and self.mixed.kv else self.dtype

    @property
    def precision_name(self) -> str:
        """"fp32", "bf16", or "bf16+fp32" (projections in bf16 from `mixed.min_rows` rows on,
        the KV pool too with `mixed.kv`; norms, residual stream and lm_head in fp32) for logs
        and stats."""
        base = dtype_name(self.dtype)
        if self._extend_layers is None or self.mixed is None:
            return base
        return f"{dtype_name(self.mixed.dtype)}+{base}"

    @property
    def weights_name(self) -> str:
        """"dense", or which packed layouts the forwards read (`PackedWeights.name`; mixed
        precision's extends on bf16 weights in oneDNN's layout say "onednn bf16 extends")."""
        if self.packed is None:
            return "dense"
        if self.packed.codes():
            return self.packed.name
        extend = self._extend_layers[0].qkv if self._extend_layers else None
        if isinstance(extend, OneDnnWeight):
            decodes = self.packed.name.split(", ")[0]
            return f"{decodes}, onednn {dtype_name(extend.packed.dtype)} extends"
        return self.packed.name

    @property
    def decode_max_rows(self) -> int | None:
        """The most rows a forward takes on the decode path by default (the GGUF codes: one
        summation order per row, whatever the batch); None where every forward takes one path
        (no packed weights)."""
        return self.packed.max_rows if self.packed is not None else None

    def _on_decode_path(self, num_rows: int, decode_path: bool | None) -> bool:
        if self.packed is None:
            return False
        return decode_path if decode_path is not None else num_rows <= self.packed.max_rows

    def _linears(self, num_rows: int, decode_path: bool | None = None) -> Sequence[LayerWeights]:
        """The projection weights a forward of `num_rows` rows uses (`decode_path` forces or
        forbids the packed decode weights; None decides by `num_rows`)."""
        packed = self.packed
        if packed is not None and self._on_decode_path(num_rows, decode_path):
            return packed.decode_layers
        if (self._extend_layers is not None and self.mixed is not None
                and num_rows >= self.mixed.min_rows):
            return self._extend_layers
        if packed is not None and packed.extend_layers is not None:
            return packed.extend_layers
        return self.weights.layers

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: AttentionFn) -> torch.Tensor:
        """input_ids, positions: int64 (N,). Returns final-normed hidden states (N, hidden)."""
        hidden, _ = self.forward_captured(input_ids, positions, attention, ())
        return hidden

    @torch.inference_mode()
    def forward_captured(self, input_ids: torch.Tensor, positions: torch.Tensor,
                         attention: AttentionFn, layers: Sequence[int],
                         decode_path: bool | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward`, also returning the residual stream entering each of `layers` (transformers'
        `output_hidden_states[i]`: 0 is the scaled embedding, L the last layer's output before
        the final norm), side by side: (N, len(layers) * hidden) in the stream's dtype, None
        when `layers` is empty. The copies are taken in the same pass (EAGLE-3's features).
        `decode_path`: see `_linears`."""
        cfg = self.config
        num_layers = len(self.weights.layers)
        if any(not 0 <= i <= num_layers for i in layers):
            raise ValueError(f"capture layers {tuple(layers)} outside 0..{num_layers}")
        linears = self._linears(input_ids.shape[0], decode_path)
        # The C row ops serve any CPU forward of a packed model (decode on codes, extend on
        # oneDNN weights, fp32 or mixed precision's bf16); the torch ops are the reference.
        ops = CPU_OPS if self.packed is not None and rowops.kernel() is not None else TORCH_OPS
        x = embedding(input_ids, self.weights.embed)
        if cfg.embed_scale is not None:
            x = x * torch.tensor(cfg.embed_scale, dtype=x.dtype)
        x = x.contiguous()
        positions = positions.contiguous()
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.weights.layers):
            if i in layers:
                captured[i] = x.clone()  # the layer updates x in place
            decoder_layer(ops, cfg, layer, linears[i], self.attention_specs[i], x, positions,
                          self._rotary[i], attention, self.reduce)
        if num_layers in layers:
            captured[num_layers] = x.clone()
        aux = torch.cat([captured[i] for i in layers], dim=-1) if layers else None
        return ops.rms_norm(x, self.weights.norm, cfg.rms_norm_eps, x.dtype), aux

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, decode_path: bool | None = None) -> torch.Tensor:
        """(M, hidden) -> fp32 logits (M, vocab). Call it only on rows that need a next token.
        `decode_path` as in `_linears`."""
        lm_head: Weight = self._lm_head
        if self.packed is not None and self._on_decode_path(hidden.shape[0], decode_path):
            lm_head = self.packed.lm_head
        return linear(hidden, lm_head).float()


def _cast_linears(layer: LayerWeights, dtype: torch.dtype, pack: bool = False) -> LayerWeights:
    """`layer` with its dense projection weights (and q/k/v bias) in `dtype`, in oneDNN's layout
    when `pack` (on the CPU, where oneDNN is available); norms are not used. `layer` is a
    model's own dense layer, never a packed one."""
    pack = pack and layer.attn_norm.device.type == "cpu" and onednn.packs(dtype)

    def cast(weight: Weight) -> Weight:
        if isinstance(weight, GgmlWeight):
            return weight  # codes compute on their own path, whatever the extends' dtype
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"only dense weights are cast, got {type(weight).__name__}")
        return onednn.OneDnnWeight.pack(weight.to(dtype)) if pack else weight.to(dtype)

    bias = layer.qkv_bias.to(dtype) if layer.qkv_bias is not None else None
    return replace(with_projections(layer, cast), qkv_bias=bias)
