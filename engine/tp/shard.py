"""How a decoder splits over tensor-parallel ranks, and the shard each rank builds its model from.

Rank r of tp holds (Megatron-style; `n / tp` of everything split, in order):

- q/k/v (fused rows): column-parallel by head: q heads [r * nh/tp, (r + 1) * nh/tp), and the
  same run of k and v heads of nkv/tp. Their biases and the attention sinks follow the heads;
  q/k norms (one weight over head_dim) are replicated.
- o: row-parallel, its input columns being the rank's q heads. The partial outputs are summed
  over the ranks right after it (one all-reduce per attention block); o's bias is added once,
  after the sum (engine.models.decoder).
- gate/up (fused rows): column-parallel by intermediate unit; down: row-parallel over the same
  units; one all-reduce per MLP block.
- MoE: the experts are split across ranks, whole (rank r holds experts [r * E/tp, ...) with
  their biases). The router is replicated, so every rank routes every token alike, and each
  sums only its own experts' outputs before the MLP block's all-reduce.
- Embedding and final norm: replicated. lm_head: replicated on rank 0, which alone computes
  logits and samples; followers hold an empty one.
- KV: the rank's model config counts its nkv/tp KV heads, so the pool built from it holds them.

Quantised weights (the GGUF codes kernel, engine.models.quant). A column split selects whole
output rows of codes (`PackedWeight.rows`), exact for every format. A row split cuts the input
dim, along which codes come in blocks of 32 weights with their own scale (and offset). K-quant
super-blocks of 256 are already repacked at load into such 32-weight sub-blocks, each with its
own scale and offset (`quant._pack_q4_k`), so the shard keeps its codes, sliced by block,
whenever its column range starts and ends on a multiple of 32 (SmolLM2-135M over 3 ranks: o's
192 and down's 512 columns). Otherwise (intermediate 96 over 2 ranks: 48 columns) the shard is
the dense fp32 slice of the weight, the same values the codes hold (the loader dequantises them
bit for bit), and that projection decodes from fp32 on that rank. Types the kernel does not read
(Q5_K, Q6_K, F16) are dense already and split as dense. Extend layouts are rebuilt from the
shards: int8 GEMM blocks from the sliced codes, oneDNN copies from the dense slices.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.config import ModelConfig
from engine.errors import InvalidParallelism
from engine.models.decoder import DecoderModel, Reduce
from engine.models.int8_gemm import Int8Weight
from engine.models.linear import Weight
from engine.models.loader import int8_extend_layer, onednn_extend_layer
from engine.models.quant import BLOCK, PackedWeight
from engine.models.weights import (
    LayerWeights,
    MixedPrecision,
    ModelWeights,
    MoEWeights,
    PackedWeights,
    projections,
)


@dataclass(frozen=True)
class ModelShard:
    """What one rank's model is built from (`build_model`). Picklable: dense tensors and GGUF
    codes only; the extend layouts, which are not, are rebuilt from `extend_kind`."""

    config: ModelConfig  # the rank's: its heads, KV heads and MLP units
    weights: ModelWeights
    dtype: torch.dtype
    mixed: MixedPrecision | None
    packed: PackedWeights | None  # decode layers and lm_head; extend_layers None
    extend_kind: str | None  # "int8", "onednn", or None: extends on the dense weights


def check_split(config: ModelConfig, tp: int) -> None:
    """Raises `InvalidParallelism` unless `tp` divides the heads, the KV heads, the dense MLP's
    intermediate units and the experts of `config`."""
    if tp < 1:
        raise InvalidParallelism(f"--tp must be >= 1, got {tp}")
    counts = {"attention heads": config.num_heads, "KV heads": config.num_kv_heads}
    if any(not config.is_moe_layer(i) for i in range(config.num_layers)):
        counts["MLP intermediate units"] = config.intermediate_size
    if config.moe is not None:
        counts["experts"] = config.moe.num_experts
    bad = [f"{count} {what}" for what, count in counts.items() if count % tp]
    if bad:
        raise InvalidParallelism(
            f"--tp {tp} does not divide this model ({config.architecture}): it has "
            f"{', '.join(bad)}; --tp must divide each of "
            f"{', '.join(f'{c} {w}' for w, c in counts.items())}")


def local_config(config: ModelConfig, tp: int) -> ModelConfig:
    """The config of one rank's shard (after `check_split`): its share of the heads, KV heads
    and dense intermediate units; the MoE config stays whole (the router scores every expert)."""
    dense = any(not config.is_moe_layer(i) for i in range(config.num_layers))
    return replace(config, num_heads=config.num_heads // tp,
                   num_kv_heads=config.num_kv_heads // tp,
                   intermediate_size=config.intermediate_size // tp if dense
                   else config.intermediate_size)


@dataclass(frozen=True)
class _Split:
    config: ModelConfig
    tp: int
    rank: int

    def span(self, total: int) -> tuple[int, int]:
        """This rank's [start, stop) of `total` things split evenly."""
        size = total // self.tp
        return self.rank * size, (self.rank + 1) * size

    def head_span(self, num_heads: int) -> tuple[int, int]:
        start, stop = self.span(num_heads)
        return start * self.config.head_dim, stop * self.config.head_dim

    @property
    def qkv_rows(self) -> torch.Tensor:
        """Rows of the fused q/k/v weight this rank holds: its q, then k, then v heads."""
        cfg = self.config
        q, kv = self.head_span(cfg.num_heads), self.head_span(cfg.num_kv_heads)
        return torch.cat([torch.arange(*q), cfg.q_size + torch.arange(*kv),
                          cfg.q_size + cfg.kv_size + torch.arange(*kv)])

    def gate_up_rows(self, intermediate: int) -> torch.Tensor:
        units = torch.arange(*self.span(intermediate))
        return torch.cat([units, intermediate + units])


def _rows(weight: Weight, index: torch.Tensor, dense: torch.Tensor) -> Weight:
    """Column-parallel: the rows `index` of a decode weight (codes keep their codes)."""
    return weight.rows(index) if isinstance(weight, PackedWeight) else dense


def _cols(weight: Weight, start: int, stop: int, dense: torch.Tensor) -> Weight:
    """Row-parallel: columns [start, stop) of a decode weight; codes keep their codes when the
    range falls on block boundaries, else the dense slice (the same values) stands in."""
    if isinstance(weight, PackedWeight) and start % BLOCK == 0 and stop % BLOCK == 0:
        blocks = slice(start // BLOCK, stop // BLOCK)
        return PackedWeight(weight.fmt, weight.codes[:, blocks].contiguous(),
                            weight.d[:, blocks].contiguous(),
                            None if weight.m is None else weight.m[:, blocks].contiguous())
    return dense


def _dense(weight: Weight | None) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"the reference weights are dense, got {type(weight).__name__}")
    return weight


def _copy(t: torch.Tensor) -> torch.Tensor:
    # A slice is copied into its own storage: pickling a view would ship its whole base, and
    # keeping one would keep the whole model alive.
    return t.clone(memory_format=torch.contiguous_format)


def _moe(moe: MoEWeights, split: _Split) -> MoEWeights:
    start, stop = split.span(moe.gate_up.shape[0])

    def take(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else _copy(t[start:stop])

    gate_up, down = take(moe.gate_up), take(moe.down)
    assert gate_up is not None and down is not None
    return MoEWeights(moe.router, gate_up, down, moe.router_bias, take(moe.gate_up_bias),
                      take(moe.down_bias), first_expert=start)


def _layer(layer: LayerWeights, split: _Split) -> LayerWeights:
    """The rank's part of one dense reference layer."""
    qkv_rows = split.qkv_rows
    q_start, q_stop = split.head_span(split.config.num_heads)
    heads = split.span(split.config.num_heads)
    gate_up = down = None
    if layer.gate_up is not None:
        gate_up_dense = _dense(layer.gate_up)
        start, stop = split.span(gate_up_dense.shape[0] // 2)
        gate_up = _copy(gate_up_dense[split.gate_up_rows(gate_up_dense.shape[0] // 2)])
        down = _copy(_dense(layer.down)[:, start:stop])
    return replace(
        layer, qkv=_copy(_dense(layer.qkv)[qkv_rows]),
        qkv_bias=None if layer.qkv_bias is None else _copy(layer.qkv_bias[qkv_rows]),
        o=_copy(_dense(layer.o)[:, q_start:q_stop]), gate_up=gate_up, down=down,
        sinks=None if layer.sinks is None else _copy(layer.sinks[heads[0]:heads[1]]),
        moe=None if layer.moe is None else _moe(layer.moe, split))


def _decode_layer(codes: LayerWeights, shard: LayerWeights, split: _Split) -> LayerWeights:
    """The rank's decode weights: `shard` (its dense layer) with each projection the GGUF's
    codes hold taken from the codes."""
    q_start, q_stop = split.head_span(split.config.num_heads)
    gate_up, down = shard.gate_up, shard.down
    if codes.gate_up is not None and gate_up is not None and down is not None:
        intermediate = _dense(down).shape[1] * split.tp
        start, stop = split.span(intermediate)
        gate_up = _rows(codes.gate_up, split.gate_up_rows(intermediate), _dense(gate_up))
        assert codes.down is not None
        down = _cols(codes.down, start, stop, _dense(down))
    return replace(shard, qkv=_rows(codes.qkv, split.qkv_rows, _dense(shard.qkv)),
                   o=_cols(codes.o, q_start, q_stop, _dense(shard.o)),
                   gate_up=gate_up, down=down)


def _extend_kind(packed: PackedWeights | None) -> str | None:
    if packed is None or packed.extend_layers is None:
        return None
    kinds = {type(w) for layer in packed.extend_layers for w in projections(layer)}
    return "int8" if Int8Weight in kinds else "onednn"


def shard_model(model: DecoderModel, tp: int, rank: int) -> ModelShard:
    """Rank `rank`'s shard of `model` (a whole model on the CPU; `check_split` first). Copies
    what it splits; replicated tensors are shared with `model`."""
    cfg = model.config
    split = _Split(cfg, tp, rank)
    w = model.weights
    layers = [_layer(layer, split) for layer in w.layers]
    if rank == 0:
        lm_head = w.embed if w.lm_head is w.embed else w.lm_head
    else:
        lm_head = w.embed.new_empty((0, w.embed.shape[1]))
    weights = ModelWeights(w.embed, layers, w.norm, lm_head)
    packed = None
    if model.packed is not None:
        decode = tuple(_decode_layer(codes, layer, split)
                       for codes, layer in zip(model.packed.decode_layers, layers, strict=True))
        packed = replace(model.packed, decode_layers=decode, extend_layers=None,
                         lm_head=model.packed.lm_head if rank == 0 else lm_head)
    return ModelShard(local_config(cfg, tp), weights, model.dtype, model.mixed, packed,
                      _extend_kind(model.packed))


def build_model(shard: ModelShard, reduce: Reduce) -> DecoderModel:
    """The rank's model from its shard, summing partial outputs with `reduce`."""
    packed = shard.packed
    if packed is not None and shard.extend_kind == "int8":
        packed = replace(packed, extend_layers=tuple(
            int8_extend_layer(dense, codes)
            for dense, codes in zip(shard.weights.layers, packed.decode_layers, strict=True)))
    elif packed is not None and shard.extend_kind == "onednn":
        packed = replace(packed, extend_layers=tuple(
            onednn_extend_layer(layer) for layer in shard.weights.layers))
    return DecoderModel(shard.config, shard.weights, shard.dtype, shard.mixed, packed, reduce)
