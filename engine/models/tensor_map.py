"""Checkpoint tensor names to the decoder's weights, one tensor at a time.

A family lists `Rule`s: a checkpoint name pattern (`{i}` a layer, `{e}` an expert) and the
canonical name it fills (`layers.{i}.q`, `layers.{i}.experts.gate_up`, ...), with a transform
where the checkpoint's layout differs from ours. The loaders read each tensor once, transform
it and hand it to an `Assembler`, which checks its shape against what the config needs before
keeping it; `build_weights` then fuses q/k/v and gate/up one layer at a time, so peak memory
stays near the size of the weights. A name no rule matches, a shape that does not fit and a
tensor the config needs that never came are errors that name the tensor; nothing half-loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from engine.config import ModelConfig
from engine.errors import UnsupportedModel
from engine.models.ggml_weight import GgmlTensor, GgmlWeight, Table
from engine.models.linear import Weight
from engine.models.weights import LayerWeights, ModelWeights, MoEWeights

Transform = Callable[[torch.Tensor, ModelConfig], torch.Tensor]


@dataclass(frozen=True)
class Rule:
    """`source` (a checkpoint name with `{i}`/`{e}` fields, `{*}` for any text) fills canonical
    `target` (with the same fields; None: a tensor to skip). `part`: "gate" or "up" fill that
    half of a fused experts' gate_up ((E, 2I, H): rows [0, I) or [I, 2I)); with `{e}` in
    `source`, only expert e's slice is filled. `transform` maps the checkpoint's tensor to ours
    (fp32 in, fp32 out)."""

    source: str
    target: str | None
    transform: Transform | None = None
    part: str | None = None
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = re.escape(self.source).replace(r"\{i\}", r"(?P<i>\d+)").replace(
            r"\{e\}", r"(?P<e>\d+)").replace(r"\{\*\}", ".*")
        object.__setattr__(self, "pattern", re.compile(regex + "$"))


@dataclass(frozen=True)
class Placement:
    """Where one checkpoint tensor goes: canonical name, expert (or None), part (or None)."""

    target: str
    expert: int | None
    part: str | None
    transform: Transform | None


@dataclass(frozen=True)
class RowPermutation:
    """A transform that reorders rows (llama.cpp's Q/K permutation undone): it applies to the
    dense tensor and, as the same row order, to the GGUF codes the packed path reads."""

    heads: Callable[[ModelConfig], int]

    def index(self, cfg: ModelConfig, num_rows: int) -> torch.Tensor:
        return unpermute_qk(torch.arange(num_rows), self.heads(cfg))

    def __call__(self, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        return tensor[self.index(cfg, tensor.shape[0])]


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's permutation of Q/K rows (or biases), which its converter applies to
    `llama` GGUFs so interleaved (GPT-J style) rotary can be used; the forward here rotates
    halves (HF's layout)."""
    rows = weight.shape[0]
    return (weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def place(rules: Sequence[Rule], name: str) -> Placement | None:
    """The placement of checkpoint tensor `name`; None for a tensor to skip. Raises
    `UnsupportedModel` for a name no rule knows."""
    for rule in rules:
        match = rule.pattern.match(name)
        if match is None:
            continue
        if rule.target is None:
            return None
        fields_ = match.groupdict()
        target = rule.target.replace("{i}", fields_.get("i") or "")
        expert = int(fields_["e"]) if fields_.get("e") is not None else None
        return Placement(target, expert, rule.part, rule.transform)
    raise UnsupportedModel(f"checkpoint has tensor '{name}', which this architecture does not "
                           "use (a different model, or a variant radixgate does not support)")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor the config needs, with its shape."""
    h, hd = cfg.hidden_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"embed": (cfg.vocab_size, h), "norm": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes |= {p + "attn_norm": (h,), p + "ffn_norm": (h,), p + "q": (cfg.q_size, h),
                   p + "k": (cfg.kv_size, h), p + "v": (cfg.kv_size, h), p + "o": (h, cfg.q_size)}
        if cfg.has_qkv_bias:
            shapes |= {p + "q_bias": (cfg.q_size,), p + "k_bias": (cfg.kv_size,),
                       p + "v_bias": (cfg.kv_size,)}
        if cfg.has_o_bias:
            shapes[p + "o_bias"] = (h,)
        if cfg.qk_norm:
            shapes |= {p + "q_norm": (hd,), p + "k_norm": (hd,)}
        if cfg.sandwich_norm:
            shapes |= {p + "post_attn_norm": (h,), p + "post_ffn_norm": (h,)}
        if cfg.attn_sinks:
            shapes[p + "sinks"] = (cfg.num_heads,)
        moe = cfg.moe
        if moe is not None and cfg.is_moe_layer(i):
            e, inter = moe.num_experts, moe.intermediate_size
            shapes |= {p + "router": (e, h), p + "experts.gate_up": (e, 2 * inter, h),
                       p + "experts.down": (e, h, inter)}
            if moe.router_bias:
                shapes[p + "router_bias"] = (e,)
            if moe.expert_bias:
                shapes |= {p + "experts.gate_up_bias": (e, 2 * inter),
                           p + "experts.down_bias": (e, h)}
        else:
            inter = cfg.intermediate_size
            shapes |= {p + "gate": (inter, h), p + "up": (inter, h), p + "down": (h, inter)}
    return shapes


def _slot(shape: tuple[int, ...],
          placement: Placement) -> tuple[tuple[int, ...], tuple[int | slice, ...]]:
    """The shape and index of the part of a canonical (E, ...) tensor a placement fills: one
    expert's slice, the gate or up half of every expert's rows, or that half of one expert."""
    if placement.expert is not None and placement.expert >= shape[0]:
        raise UnsupportedModel(f"expert {placement.expert} of '{placement.target}' is past the "
                               f"config's {shape[0]} experts")
    lead: tuple[int | slice, ...] = (
        (placement.expert,) if placement.expert is not None else (slice(None),))
    rest = list(shape[1:])
    index = lead
    if placement.part is not None:
        if placement.part not in ("gate", "up"):
            raise ValueError(f"unknown part '{placement.part}'")
        half = rest[0] // 2
        index = (*lead, slice(0, half) if placement.part == "gate" else slice(half, 2 * half))
        rest[0] = half
    sub = tuple(rest) if placement.expert is not None else (shape[0], *rest)
    return sub, index


class Assembler:
    """Collects canonical tensors in `dtype` (or as GGUF codes), checking each against the
    config's shapes."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        self.cfg = cfg
        self.dtype = dtype
        self.shapes = expected_shapes(cfg)
        self.tensors: dict[str, torch.Tensor | GgmlTensor] = {}
        self._filled: dict[str, int] = {}  # parts filled of a tensor assembled from parts

    def put_codes(self, source: str, placement: Placement, codes: GgmlTensor) -> None:
        """A whole quantised tensor kept as its codes (a row permutation, llama's Q/K, copies
        the rows; no other transform applies to codes)."""
        target = placement.target
        if target not in self.shapes or placement.expert is not None or placement.part:
            raise UnsupportedModel(f"checkpoint tensor '{source}' ({target}) cannot be read "
                                   "from its codes here")
        if isinstance(placement.transform, RowPermutation):
            codes = codes.rows(placement.transform.index(self.cfg, codes.n))
        elif placement.transform is not None:
            raise UnsupportedModel(f"checkpoint tensor '{source}' needs a transform its codes "
                                   "do not take")
        _check_shape(source, target, (codes.n, codes.k), self.shapes[target])
        if target in self.tensors:
            raise UnsupportedModel(f"checkpoint has '{target}' twice (last: '{source}')")
        self.tensors[target] = codes

    def put(self, source: str, placement: Placement, tensor: torch.Tensor) -> None:
        target = placement.target
        if target not in self.shapes:
            raise UnsupportedModel(f"checkpoint tensor '{source}' ({target}) is not used by "
                                   "this config (a layer or feature the config does not have)")
        if placement.transform is not None:
            tensor = placement.transform(tensor.float(), self.cfg)
        shape = self.shapes[target]
        if placement.expert is None and placement.part is None:
            _check_shape(source, target, tuple(tensor.shape), shape)
            if target in self.tensors:
                raise UnsupportedModel(f"checkpoint has '{target}' twice (last: '{source}')")
            self.tensors[target] = _keep_dtype(target, tensor, self.dtype)
            return
        sub_shape, index = _slot(shape, placement)
        _check_shape(source, target, tuple(tensor.shape), sub_shape)
        whole = self.tensors.get(target)
        if whole is None:
            whole = self.tensors[target] = torch.empty(shape, dtype=self.dtype)
        assert isinstance(whole, torch.Tensor)
        whole[index] = tensor
        self._filled[target] = self._filled.get(target, 0) + tensor.numel()

    def finish(self) -> dict[str, torch.Tensor | GgmlTensor]:
        """The tensors, after checking that every needed one came whole."""
        missing = [name for name in self.shapes if name not in self.tensors]
        partial = [name for name, count in self._filled.items()
                   if count != _numel(self.tensors[name])]
        if missing or partial:
            what = [f"'{n}'" for n in missing[:6]] + [f"'{n}' (some experts)" for n in partial[:6]]
            raise UnsupportedModel(f"checkpoint lacks {len(missing) + len(partial)} tensors the "
                                   f"config needs: {', '.join(what)}")
        return self.tensors


def _numel(tensor: torch.Tensor | GgmlTensor) -> int:
    return tensor.numel() if isinstance(tensor, torch.Tensor) else tensor.n * tensor.k


def fuse(parts: list[torch.Tensor | GgmlTensor]) -> Weight:
    """Tensors fused by rows into one weight: codes stay codes (`GgmlWeight`, whatever their
    types); dense tensors are concatenated. Codes fused with a dense tensor (a GGUF that
    quantised q and k but kept v in F16) are dequantised to join it."""
    if all(isinstance(p, GgmlTensor) for p in parts):
        return GgmlWeight(tuple(p for p in parts if isinstance(p, GgmlTensor)))
    dense = [p if isinstance(p, torch.Tensor) else GgmlWeight((p,)).dense() for p in parts]
    dtype = next(p.dtype for p in parts if isinstance(p, torch.Tensor))
    return torch.cat([d.to(dtype) for d in dense]) if len(dense) > 1 else dense[0]


def _check_shape(source: str, target: str, got: tuple[int, ...],
                 want: tuple[int, ...]) -> None:
    if got != want:
        raise UnsupportedModel(f"checkpoint tensor '{source}' ({target}) has shape {list(got)}; "
                               f"the config needs {list(want)}")


def _keep_dtype(target: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Norm weights and sinks stay fp32 (the norms compute in fp32; Gemma's 1 + w would round);
    everything else in the model's dtype."""
    keep32 = target.endswith("norm") or target.endswith("sinks")
    out = tensor.to(torch.float32 if keep32 else dtype)
    return out.contiguous()


def build_weights(cfg: ModelConfig,
                  tensors: dict[str, torch.Tensor | GgmlTensor]) -> ModelWeights:
    """The decoder's weights from `Assembler.finish()`'s tensors, consumed as they are fused.
    Codes may fill the projections, the embedding and the lm_head; everything else is dense."""
    def take(name: str) -> torch.Tensor:
        tensor = tensors.pop(name)
        if not isinstance(tensor, torch.Tensor):
            raise UnsupportedModel(f"'{name}' must be dense, not {tensor.qtype.name} codes")
        return tensor

    def weight(name: str) -> Weight:
        return fuse([tensors.pop(name)])

    def table(name: str) -> Table:
        fused = fuse([tensors.pop(name)])
        assert isinstance(fused, torch.Tensor | GgmlWeight)
        return fused

    def maybe(name: str) -> torch.Tensor | None:
        return take(name) if name in tensors else None

    layers = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        qkv = fuse([tensors.pop(p + "q"), tensors.pop(p + "k"), tensors.pop(p + "v")])
        biases = [maybe(p + n) for n in ("q_bias", "k_bias", "v_bias")]
        qkv_bias = torch.cat([b for b in biases if b is not None]) if biases[0] is not None \
            else None
        moe = None
        gate_up = down = None
        if cfg.is_moe_layer(i):
            moe = MoEWeights(router=take(p + "router"), gate_up=take(p + "experts.gate_up"),
                             down=take(p + "experts.down"), router_bias=maybe(p + "router_bias"),
                             gate_up_bias=maybe(p + "experts.gate_up_bias"),
                             down_bias=maybe(p + "experts.down_bias"))
        else:
            gate_up = fuse([tensors.pop(p + "gate"), tensors.pop(p + "up")])
            down = weight(p + "down")
        layers.append(LayerWeights(
            attn_norm=take(p + "attn_norm"), qkv=qkv, qkv_bias=qkv_bias, o=weight(p + "o"),
            ffn_norm=take(p + "ffn_norm"), gate_up=gate_up, down=down, o_bias=maybe(p + "o_bias"),
            q_norm=maybe(p + "q_norm"), k_norm=maybe(p + "k_norm"),
            post_attn_norm=maybe(p + "post_attn_norm"), post_ffn_norm=maybe(p + "post_ffn_norm"),
            sinks=maybe(p + "sinks"), moe=moe))
    embed = table("embed")
    lm_head = embed if cfg.tie_word_embeddings else table("lm_head")
    return ModelWeights(embed=embed, layers=layers, norm=take("norm"), lm_head=lm_head)


def check_all_placed(names: Iterable[str], rules: Sequence[Rule]) -> None:
    """Raises for the first checkpoint name no rule knows, before anything is read."""
    for name in names:
        place(rules, name)
