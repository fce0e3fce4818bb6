"""Frozen model configuration, normalised from GGUF metadata or an HF config.json by the model
families (engine.models.families); everything here is one shape every family maps onto."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import UnsupportedModel

SLIDING, FULL = "sliding_attention", "full_attention"
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies depart from theta ** (-2i / d), as HF's `rope_type`s define it:
    "linear" (every frequency / factor), "llama3" (low frequencies / factor, a smooth ramp
    between), "yarn" (NTK-by-parts ramp between beta_fast and beta_slow rotations, cos/sin times
    an attention factor)."""

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "llama3", "yarn"):
            raise UnsupportedModel(f"rope_type '{self.kind}' is not supported; supported: "
                                   "default, linear, llama3, yarn")
        if self.factor <= 0:
            raise UnsupportedModel(f"rope scaling factor must be > 0, got {self.factor}")
        if self.kind in ("llama3", "yarn") and self.original_max_position_embeddings <= 0:
            raise UnsupportedModel(f"rope_type '{self.kind}' needs "
                                   "original_max_position_embeddings")


@dataclass(frozen=True)
class Rope:
    """One layer's rotary embedding. `freq_factors`: llama.cpp's `rope_freqs` tensor (Llama 3.x
    GGUFs), each inverse frequency divided by its factor."""

    theta: float
    scaling: RopeScaling | None = None
    freq_factors: tuple[float, ...] | None = None


@dataclass(frozen=True)
class MoEConfig:
    """A sparse MLP: a router picks `top_k` of `num_experts` gated MLPs per token.

    routing "softmax_topk": softmax over every expert, keep the top k (renormalised to sum 1 when
    `norm_topk_prob`) — Qwen3-MoE. "topk_softmax": top k of the raw router logits, softmax over
    those k — gpt-oss. activation "silu": silu(gate) * up; "swiglu_oai": gpt-oss's clamped
    (up + 1) * gate * sigmoid(alpha * gate), gate <= limit, |up| <= limit."""

    num_experts: int
    top_k: int
    intermediate_size: int
    layers: tuple[int, ...]
    routing: str = "softmax_topk"
    norm_topk_prob: bool = True
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "silu"
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise UnsupportedModel(f"num_experts_per_tok={self.top_k} must be in "
                                   f"1..num_experts={self.num_experts}")
        if self.routing not in ("softmax_topk", "topk_softmax"):
            raise UnsupportedModel(f"MoE routing '{self.routing}' is not supported")
        if self.activation not in ("silu", "swiglu_oai"):
            raise UnsupportedModel(f"MoE activation '{self.activation}' is not supported")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and math of a decoder. Immutable: facts found later are returned, not written."""

    architecture: str  # the family's name in engine.models.families
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    # Qwen2 and gpt-oss put biases on the q/k/v projections; gpt-oss on o too.
    has_qkv_bias: bool = False
    has_o_bias: bool = False
    rope_scaling: RopeScaling | None = None  # full-attention layers
    rope_freq_factors: tuple[float, ...] | None = None
    # Sliding layers' own rotary (Gemma 3: base 1e4, no scaling); None: the full layers' rope.
    local_rope: Rope | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # SLIDING or FULL per layer; () is every layer FULL
    qk_norm: bool = False  # RMSNorm over each q and k head before rotary (Qwen3, Gemma 3)
    sandwich_norm: bool = False  # norms on the attention and MLP outputs too (Gemma)
    activation: str = "silu"  # the dense MLP's gate: "silu" or "gelu_tanh"
    embed_scale: float | None = None  # embeddings times this (Gemma: sqrt(hidden))
    attn_scale: float | None = None  # None: head_dim ** -0.5
    attn_sinks: bool = False  # a learned sink logit per head (gpt-oss)
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads != 0:
            raise UnsupportedModel(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise UnsupportedModel(f"head_dim={self.head_dim} must be even for rotary")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise UnsupportedModel(f"layer_types has {len(self.layer_types)} entries for "
                                   f"{self.num_layers} layers")
        unknown = set(self.layer_types) - {SLIDING, FULL}
        if unknown:
            raise UnsupportedModel(f"layer types {sorted(unknown)} are not supported; "
                                   f"supported: {FULL}, {SLIDING}")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise UnsupportedModel("sliding layers need a sliding_window")
        if self.activation not in ACTIVATIONS:
            raise UnsupportedModel(f"activation '{self.activation}' is not supported; "
                                   f"supported: {ACTIVATIONS}")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise UnsupportedModel(f"rope_freqs has {len(self.rope_freq_factors)} factors for "
                                   f"head_dim {self.head_dim} (needs {self.head_dim // 2})")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_kv_values_per_token(self) -> int:
        """K and V values one token adds to the cache over all layers."""
        return 2 * self.num_layers * self.kv_size

    @property
    def attention_scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5

    def is_sliding(self, layer_idx: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer_idx] == SLIDING

    def layer_window(self, layer_idx: int) -> int | None:
        return self.sliding_window if self.is_sliding(layer_idx) else None

    def layer_rope(self, layer_idx: int) -> Rope:
        if self.is_sliding(layer_idx) and self.local_rope is not None:
            return self.local_rope
        return Rope(self.rope_theta, self.rope_scaling, self.rope_freq_factors)

    def is_moe_layer(self, layer_idx: int) -> bool:
        return self.moe is not None and layer_idx in self.moe.layers
