"""Llama-family decoder over a flattened varlen batch.

The forward takes every scheduled token of every sequence as one row of a `[num_tokens, hidden]`
matrix: decode tokens and prefill chunks alike. Only attention needs to know which rows belong to
which sequence, so attention is injected (`AttentionFn`): the dense reference attends within the
batch, the paged backends attend over the KV pool.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Protocol

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.models import onednn, rowops
from engine.models.linear import Weight, linear
from engine.models.packed_forward import packed_forward
from engine.models.quant import PackedWeight


class AttentionFn(Protocol):
    def __call__(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q: (N, num_heads, head_dim); k, v: (N, num_kv_heads, head_dim) of the new tokens,
        rotary already applied. Returns (N, num_heads, head_dim). May store k/v (paged backends)."""
        ...


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # (hidden,)
    qkv: Weight  # (q_size + 2 * kv_size, hidden): q, k, v projections fused into one GEMM
    qkv_bias: torch.Tensor | None
    o: Weight  # (hidden, q_size)
    ffn_norm: torch.Tensor
    gate_up: Weight  # (2 * intermediate, hidden): gate and up fused into one GEMM
    down: Weight  # (hidden, intermediate)


@dataclass
class LlamaWeights:
    embed: torch.Tensor  # (vocab, hidden)
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor  # (vocab, hidden); the same tensor as `embed` when tied


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Statistics in fp32 whatever the compute dtype, as the reference implementations do.
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


def rotary_tables(config: ModelConfig, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (max_positions, head_dim) in the HF "rotate half" layout."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, half, dtype=torch.float64) / half))
    pos = torch.arange(config.max_position_embeddings, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@dataclass(frozen=True)
class MixedPrecision:
    """Forwards of at least `min_rows` rows run their linear layers in `dtype`; smaller ones run
    them in the model's dtype (with the default min_rows of 1, every forward uses `dtype`).
    Norms, rotary and the residual stream stay in the model's dtype; the KV pool is in `dtype`
    when `kv` (else the model's), one pool that every step reads and writes, and attention
    computes its GEMMs in the pool's dtype. Packed decode steps (the GGUF codes kernel) stay
    fp32 whatever `min_rows` says. `min_rows` is where the lower-precision GEMM starts to win
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
    """The projections in the layouts this CPU's kernels read fastest, with the same values as
    the dense fp32 weights. Forwards of at most `max_rows` rows (decodes, draft verifications)
    take `decode_layers` and `lm_head`: the GGUF's own quantised codes (engine.models.quant),
    read at 4.5-8.5 bits a weight instead of 32. Longer forwards (prefill chunks) take
    `extend_layers`: the dense weights in oneDNN's blocked layout (engine.models.onednn), or
    the dense tensors themselves when None. A projection a kernel cannot read stays dense."""

    decode_layers: tuple[LayerWeights, ...]
    lm_head: Weight
    # Where the codes kernel stops beating the fp32 GEMM on 2 AVX2 cores: each row adds its
    # FMAs to one unpacking of the codes, while the GEMM's cost is reading fp32 weights.
    max_rows: int = 16
    extend_layers: tuple[LayerWeights, ...] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the GGUF codes (dense fallbacks and oneDNN copies not counted)."""
        weights = [w for layer in self.decode_layers for w in (layer.qkv, layer.o,
                                                                layer.gate_up, layer.down)]
        return sum(w.nbytes for w in [*weights, self.lm_head] if isinstance(w, PackedWeight))

    @property
    def name(self) -> str:
        extends = "onednn" if self.extend_layers is not None else "dense"
        return f"gguf codes (<= {self.max_rows} rows), {extends} extends"


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (N, heads, head_dim); cos/sin: (N, 1, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _dtype_name(dtype: torch.dtype) -> str:
    """"fp32", "bf16", "fp16", or torch's name of another dtype."""
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    return names.get(dtype, str(dtype))


class LlamaModel:
    """Weights plus the forward pass. Stateless across calls: all KV state lives in the backend."""

    def __init__(self, config: ModelConfig, weights: LlamaWeights, dtype: torch.dtype,
                 mixed: MixedPrecision | None = None, packed: PackedWeights | None = None) -> None:
        self.config = config
        self.weights = weights
        self.dtype = dtype
        self.device = weights.embed.device
        self.mixed = mixed
        # The packing kernel runs on the CPU, in fp32; a model moved to CUDA drops it.
        self.packed = packed if self.device.type == "cpu" and dtype == torch.float32 else None
        self._packed_layers = self.packed.decode_layers if self.packed is not None else None
        # Copies of the linear weights in the extend dtype; the fp32 ones remain for decode.
        # With packed weights they are packed too (oneDNN's layout, which AMX reads fastest).
        self._extend_layers = ([_cast_linears(layer, mixed.dtype, pack=self.packed is not None)
                                for layer in weights.layers]
                               if mixed is not None and mixed.dtype != dtype else None)
        self._lm_head = (weights.lm_head.to(mixed.dtype)
                         if mixed is not None and mixed.lm_head else weights.lm_head)
        # Built on the CPU in fp64 (exact angles), then moved next to the weights they rotate.
        cos, sin = rotary_tables(config, dtype)
        self._cos, self._sin = cos.to(self.device), sin.to(self.device)

    def to(self, device: torch.device | str) -> LlamaModel:
        """A model with every weight on `device` (this one is unchanged); a tied lm_head stays
        the same tensor as the embedding, so tying costs no extra device memory."""
        w = self.weights
        layers = [replace(layer, **{f.name: t.to(device) for f in fields(LayerWeights)
                                    if (t := getattr(layer, f.name)) is not None})
                  for layer in w.layers]
        embed = w.embed.to(device)
        lm_head = embed if w.lm_head is w.embed else w.lm_head.to(device)
        return LlamaModel(self.config, LlamaWeights(embed, layers, w.norm.to(device), lm_head),
                          self.dtype, self.mixed, self.packed)

    def with_mixed_precision(self, mixed: MixedPrecision | None) -> LlamaModel:
        """The same weights with extends in `mixed.dtype` (None: every step in `self.dtype`)."""
        return LlamaModel(self.config, self.weights, self.dtype, mixed, self.packed)

    def with_packed(self, packed: PackedWeights | None) -> LlamaModel:
        """The same weights with forwards on `packed` (None: the dense reference)."""
        return LlamaModel(self.config, self.weights, self.dtype, self.mixed, packed)

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype of the KV pool an engine builds for this model."""
        return self.mixed.dtype if self.mixed is not None and self.mixed.kv else self.dtype

    @property
    def precision_name(self) -> str:
        """"fp32", "bf16", or "bf16+fp32" (projections in bf16 from `mixed.min_rows` rows on,
        the KV pool too with `mixed.kv`; norms, residual stream and lm_head in fp32) for logs
        and stats."""
        base = _dtype_name(self.dtype)
        if self._extend_layers is None or self.mixed is None:
            return base
        return f"{_dtype_name(self.mixed.dtype)}+{base}"

    @property
    def weights_name(self) -> str:
        """"dense", or which packed layouts the forwards read (`PackedWeights.name`; mixed
        precision's extends on bf16 weights in oneDNN's layout say "onednn bf16 extends")."""
        if self.packed is None:
            return "dense"
        extend = self._extend_layers[0].qkv if self._extend_layers else None
        if isinstance(extend, onednn.OneDnnWeight):
            return (f"gguf codes (<= {self.packed.max_rows} rows), "
                    f"onednn {_dtype_name(extend.packed.dtype)} extends")
        return self.packed.name

    def _linears(self, num_rows: int) -> list[LayerWeights] | tuple[LayerWeights, ...]:
        """The projection weights a forward of `num_rows` rows uses."""
        if self._packed_layers is not None and num_rows <= self.packed.max_rows:  # type: ignore[union-attr]
            return self._packed_layers
        if (self._extend_layers is not None and self.mixed is not None
                and num_rows >= self.mixed.min_rows):
            return self._extend_layers
        if self.packed is not None and self.packed.extend_layers is not None:
            return self.packed.extend_layers
        return self.weights.layers

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionFn
    ) -> torch.Tensor:
        """input_ids, positions: int64 (N,). Returns final-normed hidden states (N, hidden)."""
        cfg = self.config
        num_tokens = input_ids.shape[0]
        linears = self._linears(num_tokens)
        # Any CPU forward of a packed model (decode on codes, extend on oneDNN weights, fp32 or
        # mixed precision's bf16).
        if self.packed is not None and rowops.kernel() is not None:
            return packed_forward(self, linears, input_ids, positions, attention, self._cos,
                                  self._sin)
        x = F.embedding(input_ids, self.weights.embed)
        cos = self._cos[positions].unsqueeze(1)
        sin = self._sin[positions].unsqueeze(1)
        for layer_idx, layer in enumerate(self.weights.layers):
            lin = linears[layer_idx]
            h = rms_norm(x, layer.attn_norm, cfg.rms_norm_eps)
            qkv = linear(h, lin.qkv, lin.qkv_bias)
            q, k, v = torch.split(qkv, [cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = apply_rotary(q.view(num_tokens, cfg.num_heads, cfg.head_dim), cos, sin)
            k = apply_rotary(k.view(num_tokens, cfg.num_kv_heads, cfg.head_dim), cos, sin)
            v = v.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            attn = attention(layer_idx, q, k, v)
            x = x + linear(attn.reshape(num_tokens, cfg.q_size), lin.o)
            h = rms_norm(x, layer.ffn_norm, cfg.rms_norm_eps)
            gate, up = linear(h, lin.gate_up).chunk(2, dim=-1)
            x = x + linear(F.silu(gate) * up, lin.down)
        return rms_norm(x, self.weights.norm, cfg.rms_norm_eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, hidden) -> fp32 logits (M, vocab). Call it only on rows that need a next token."""
        lm_head: Weight = self._lm_head
        if self.packed is not None and hidden.shape[0] <= self.packed.max_rows:
            lm_head = self.packed.lm_head
        return linear(hidden, lm_head).float()


def _cast_linears(layer: LayerWeights, dtype: torch.dtype, pack: bool = False) -> LayerWeights:
    """`layer` with its dense projection weights (and q/k/v bias) in `dtype`, in oneDNN's layout
    when `pack` (on the CPU, where oneDNN is available); norms are not used. `layer` is a
    model's own dense layer, never a packed one."""
    pack = pack and layer.attn_norm.device.type == "cpu" and onednn.available()

    def cast(weight: Weight) -> Weight:
        assert isinstance(weight, torch.Tensor), "only dense weights are cast"
        return onednn.OneDnnWeight.pack(weight.to(dtype)) if pack else weight.to(dtype)

    bias = layer.qkv_bias.to(dtype) if layer.qkv_bias is not None else None
    return replace(layer, qkv=cast(layer.qkv), qkv_bias=bias, o=cast(layer.o),
                   gate_up=cast(layer.gate_up), down=cast(layer.down))
