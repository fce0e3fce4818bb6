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

Quantised weights (GGUF codes, engine.models.ggml_weight). A column split selects whole output
rows of codes (`GgmlWeight.select_rows`), exact for every type. A row split cuts the input dim,
along which codes come in blocks of 32 (256 for the K-quants) with their own scales, so the
shard keeps its codes, sliced by block, whenever its column range starts and ends on a block
boundary (the 1.5B's o over 2 ranks: 768 columns of Q4_K; SmolLM2-135M over 3: 192 columns of
Q4_1). Otherwise (intermediate 96 over 2 ranks: 48 columns) the shard is the dense fp32 slice
of the weight, the same values the codes hold (gguf's dequantiser, bit for bit), and that
projection runs fp32 on that rank. oneDNN copies of dense projections are rebuilt from the
shards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.config import ModelConfig
from engine.errors import InvalidParallelism
from engine.models.decoder import DecoderModel, Reduce
from engine.models.ggml_weight import GgmlWeight, Table
from engine.models.linear import Weight
from engine.models.loader import onednn_extend_layer
from engine.models.weights import (
    LayerWeights,
    MixedPrecision,
    ModelWeights,
    MoEWeights,
    PackedWeights,
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
    extend_kind: str | None  # "onednn", or None: extends on the shard's own weights


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


def _rows(weight: Weight | None, index: torch.Tensor) -> Weight:
    """Column-parallel: the rows `index` of a weight (codes keep their codes)."""
    if isinstance(weight, GgmlWeight):
        return weight.select_rows(index)
    return _copy(_dense(weight)[index])


def _cols(weight: Weight | None, start: int, stop: int) -> Weight:
    """Row-parallel: columns [start, stop) of a weight; codes keep their codes when the range
    falls on block boundaries, else the dense slice (the same values) stands in."""
    if isinstance(weight, GgmlWeight):
        sliced = weight.columns(start, stop)
        return sliced if sliced is not None else weight.dense()[:, start:stop].contiguous()
    return _copy(_dense(weight)[:, start:stop])


def _dense(weight: Weight | None) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"expected a dense weight, got {type(weight).__name__}")
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
    """The rank's part of one layer."""
    qkv_rows = split.qkv_rows
    q_start, q_stop = split.head_span(split.config.num_heads)
    heads = split.span(split.config.num_heads)
    gate_up = down = None
    if layer.gate_up is not None:
        intermediate = layer.gate_up.shape[0] // 2
        start, stop = split.span(intermediate)
        gate_up = _rows(layer.gate_up, split.gate_up_rows(intermediate))
        down = _cols(layer.down, start, stop)
    return replace(
        layer, qkv=_rows(layer.qkv, qkv_rows),
        qkv_bias=None if layer.qkv_bias is None else _copy(layer.qkv_bias[qkv_rows]),
        o=_cols(layer.o, q_start, q_stop), gate_up=gate_up, down=down,
        sinks=None if layer.sinks is None else _copy(layer.sinks[heads[0]:heads[1]]),
        moe=None if layer.moe is None else _moe(layer.moe, split))


def shard_model(model: DecoderModel, tp: int, rank: int) -> ModelShard:
    """Rank `rank`'s shard of `model` (a whole model on the CPU; `check_split` first). Copies
    what it splits; replicated tensors are shared with `model`."""
    cfg = model.config
    split = _Split(cfg, tp, rank)
    w = model.weights
    layers = [_layer(layer, split) for layer in w.layers]
    lm_head: Table = w.lm_head
    if rank != 0:
        lm_head = torch.empty((0, cfg.hidden_size), dtype=w.norm.dtype)
    weights = ModelWeights(w.embed, layers, w.norm, lm_head)
    packed = None
    if model.packed is not None:
        packed = replace(model.packed, decode_layers=tuple(layers), extend_layers=None,
                         lm_head=lm_head)
    extend_kind = ("onednn" if model.packed is not None and model.packed.extend_layers
                   else None)
    return ModelShard(local_config(cfg, tp), weights, model.dtype, model.mixed, packed,
                      extend_kind)


def build_model(shard: ModelShard, reduce: Reduce) -> DecoderModel:
    """The rank's model from its shard, summing partial outputs with `reduce`."""
    packed = shard.packed
    if packed is not None and shard.extend_kind == "onednn":
        packed = replace(packed, extend_layers=tuple(
            onednn_extend_layer(layer) for layer in shard.weights.layers))
    return DecoderModel(shard.config, shard.weights, shard.dtype, shard.mixed, packed, reduce)
