"""An EAGLE-3 draft head's config.json, read as SGLang and vLLM read it.

Two layouts are accepted:
- `LlamaForCausalLMEagle3` (EAGLE, SpecForge, SGLang): the layer's fields at the top level, the
  captured layers (optional) in `eagle_config.eagle_aux_hidden_state_layer_ids`.
- `Eagle3Speculator` (vLLM's "speculators"): the layer's fields in `transformer_layer_config`,
  the captured layers (optional) in a top-level `eagle_aux_hidden_state_layer_ids`, and
  `norm_before_residual` defaulting to true (vLLM's `update_eagle3`).

Captured layer ids. Ours (`Eagle3Config.captured_layer_ids`) name the residual stream *entering*
target layer i, i.e. `hidden_states + residual` before layer i runs, which is HF's
`output_hidden_states[i]` (index 0 is the embeddings). The default is (2, L//2, L-3), as in both
engines. The two layouts count differently, and each is read as its engine reads it:
- `eagle_config.eagle_aux_hidden_state_layer_ids` counts layer *outputs*: SGLang adds 1
  (`set_eagle3_layers_to_capture`), so [1, 15, 26] here is our (2, 16, 27).
- a top-level `eagle_aux_hidden_state_layer_ids` is used as is by vLLM
  (`get_eagle3_aux_layers_from_config`, then `idx in aux_hidden_state_layers` before layer idx).
A field that changes the math and is not implemented is refused by name, never ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.config import Rope
from engine.errors import InvalidDraftHead, UnsupportedModel
from engine.models.families import hf_config

LLAMA_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"


@dataclass(frozen=True)
class Eagle3Config:
    """One EAGLE-3 decoder layer over the target's captured features, resolved for one target
    (the default captured layers depend on its number of layers).

    `captured_layer_ids`: ascending; see the module docstring for what an id means. The fused
    input is these streams concatenated in this order (the engines capture them in the
    forward's layer loop, so in ascending order whatever order the config lists them in)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: Rope
    max_position_embeddings: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    tie_word_embeddings: bool
    captured_layer_ids: tuple[int, ...]
    # vLLM's option, honoured in either layout as vLLM honours it (SGLang ignores it): the
    # residual is hidden_norm(h) instead of h.
    norm_before_residual: bool = False

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def fused_size(self) -> int:
        """Width of the fused target features `fc` reads: one target hidden per captured layer."""
        return len(self.captured_layer_ids) * self.target_hidden_size


def default_captured_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """(2, L//2, L-3): SGLang, vLLM and EAGLE's defaults, in our "entering layer i" sense."""
    return (2, num_target_layers // 2, num_target_layers - 3)


def parse_eagle3_config(raw: Mapping[str, Any], *, num_target_layers: int,
                        where: str = "config.json") -> Eagle3Config:
    """Read a head's config.json (already JSON-decoded). `where` names the file in messages.
    Pure. Raises `InvalidDraftHead` naming the field when the layout is unknown, a field is
    missing or set to something not implemented, or a captured layer is outside the target."""
    archs = raw.get("architectures") or []
    if LLAMA_ARCHITECTURE in archs:
        layer: Mapping[str, Any] = raw
        norm_before_residual_default = False
    elif SPECULATORS_ARCHITECTURE in archs:
        layer = _required(raw, "transformer_layer_config", where)
        if not isinstance(layer, Mapping):
            raise InvalidDraftHead(f"{where}: transformer_layer_config is not an object")
        norm_before_residual_default = True
        for key, what in (("norm_before_fc", "an RMSNorm on the fused features"),
                          ("fc_norm", "an RMSNorm on each captured layer")):
            if raw.get(key):
                raise InvalidDraftHead(f"{where} sets {key}=true, which radixgate does not "
                                       f"implement ({what})")
    else:
        raise InvalidDraftHead(
            f"{where}: architectures {list(archs)!r} names no EAGLE-3 head; expected "
            f"{LLAMA_ARCHITECTURE!r} (EAGLE, SGLang) or {SPECULATORS_ARCHITECTURE!r} (vLLM)")
    _refuse_unimplemented(layer, where)
    num_heads = int(_required(layer, "num_attention_heads", where))
    hidden = int(_required(layer, "hidden_size", where))
    vocab_size = int(_required(layer, "vocab_size", where))
    try:
        theta, scaling = hf_config.parse_rope(layer, hf_config.rope_dict(layer), 10000.0)
    except UnsupportedModel as exc:
        raise InvalidDraftHead(f"{where}: {exc}") from exc
    return Eagle3Config(
        hidden_size=hidden,
        intermediate_size=int(_required(layer, "intermediate_size", where)),
        num_heads=num_heads,
        num_kv_heads=int(layer.get("num_key_value_heads") or num_heads),
        head_dim=int(layer.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope=Rope(theta, scaling),
        max_position_embeddings=int(layer.get("max_position_embeddings") or 4096),
        vocab_size=vocab_size,
        draft_vocab_size=int(raw.get("draft_vocab_size") or layer.get("draft_vocab_size")
                             or vocab_size),
        target_hidden_size=int(raw.get("target_hidden_size")
                               or layer.get("target_hidden_size") or hidden),
        tie_word_embeddings=bool(layer.get("tie_word_embeddings", False)),
        captured_layer_ids=_captured_layer_ids(raw, num_target_layers, where),
        norm_before_residual=bool(raw.get("norm_before_residual",
                                          norm_before_residual_default)))


def eagle3_config_json(config: Eagle3Config) -> dict[str, Any]:
    """The config.json of `config` in the `LlamaForCausalLMEagle3` layout, which SGLang, vLLM
    and `parse_eagle3_config` read back to an equal config. Captured ids are written counting
    layer outputs (ours - 1), the layout's convention."""
    out: dict[str, Any] = {
        "architectures": [LLAMA_ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope.theta,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "tie_word_embeddings": config.tie_word_embeddings,
        "eagle_config": {"use_aux_hidden_state": True,
                         "eagle_aux_hidden_state_layer_ids":
                             [i - 1 for i in config.captured_layer_ids]},
    }
    if config.norm_before_residual:
        out["norm_before_residual"] = True
    scaling = config.rope.scaling
    if scaling is not None:
        fields = {k: v for k, v in vars(scaling).items() if v is not None and k != "kind"}
        out["rope_scaling"] = {"rope_type": scaling.kind, **fields}
    return out


def _required(cfg: Mapping[str, Any], key: str, where: str) -> Any:
    if cfg.get(key) is None:
        raise InvalidDraftHead(f"{where} lacks '{key}'")
    return cfg[key]


def _refuse_unimplemented(layer: Mapping[str, Any], where: str) -> None:
    checks = (
        ("model_type", lambda v: v == "llama", "a draft layer other than Llama's"),
        ("num_hidden_layers", lambda v: v == 1, "a head of more than one layer"),
        ("hidden_act", lambda v: v == "silu", "a gate activation other than silu"),
        ("attention_bias", lambda v: not v, "biases on the attention projections"),
        ("mlp_bias", lambda v: not v, "biases on the MLP projections"),
        ("partial_rotary_factor", lambda v: v in (None, 1, 1.0), "rotary over part of a head"),
    )
    for key, ok, what in checks:
        if key in layer and not ok(layer[key]):
            raise InvalidDraftHead(f"{where} sets {key}={layer[key]!r}, which radixgate does not "
                                   f"implement ({what})")


def _captured_layer_ids(raw: Mapping[str, Any], num_target_layers: int,
                        where: str) -> tuple[int, ...]:
    """Our ids from either layout's field (see the module docstring), checked against the
    target; the default when neither is set."""
    candidates: list[tuple[str, tuple[int, ...]]] = []
    eagle_config = raw.get("eagle_config") or {}
    if not isinstance(eagle_config, Mapping):
        raise InvalidDraftHead(f"{where}: eagle_config is not an object")
    sglang_ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    if sglang_ids:
        candidates.append(("eagle_config.eagle_aux_hidden_state_layer_ids",
                           tuple(int(i) + 1 for i in sglang_ids)))
    vllm_ids = raw.get("eagle_aux_hidden_state_layer_ids")
    if vllm_ids:
        candidates.append(("eagle_aux_hidden_state_layer_ids", tuple(int(i) for i in vllm_ids)))
    if not candidates:
        ids = default_captured_layer_ids(num_target_layers)
        field = f"the default (2, L//2, L-3) for L={num_target_layers}"
    else:
        field, ids = candidates[0]
        if len(candidates) == 2 and sorted(candidates[1][1]) != sorted(ids):
            raise InvalidDraftHead(
                f"{where}: eagle_config.eagle_aux_hidden_state_layer_ids (layer outputs, our "
                f"{sorted(ids)}) and eagle_aux_hidden_state_layer_ids (layer inputs, "
                f"{sorted(candidates[1][1])}) disagree; keep one")
    if len(set(ids)) != len(ids):
        raise InvalidDraftHead(f"{where}: {field} lists a layer twice: {list(ids)}")
    outside = [i for i in ids if not 0 <= i < num_target_layers]
    if outside:
        raise InvalidDraftHead(
            f"{where}: {field} captures the stream entering layer(s) {outside}, outside the "
            f"target's 0..{num_target_layers - 1} ({num_target_layers} layers)")
    return tuple(sorted(ids))
