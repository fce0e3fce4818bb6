"""Reading a transformers `config.json` into `ModelConfig` fields: the parts every family shares.

transformers 5 moved `rope_theta`/`rope_scaling` into `rope_parameters` (nested by layer type for
Gemma 3), while configs on the Hub keep the legacy keys: both are read. A field that changes the
math and is not implemented is refused with its name (`refuse_unless`), never ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.config import FULL, SLIDING, RopeScaling
from engine.errors import UnsupportedModel

HFConfig = Mapping[str, Any]


def required(cfg: HFConfig, key: str) -> Any:
    if cfg.get(key) is None:
        raise UnsupportedModel(f"config.json lacks '{key}'")
    return cfg[key]


def refuse_unless(cfg: HFConfig, key: str, ok: Callable[[Any], bool], what: str) -> None:
    """Raise naming `key` when the config sets it to a value `ok` rejects (absent keys pass)."""
    if key in cfg and not ok(cfg[key]):
        raise UnsupportedModel(f"config.json sets {key}={cfg[key]!r}, which radixgate does not "
                               f"implement ({what})")


def common(cfg: HFConfig, name: str, *, tie_default: bool,
           quant_methods: tuple[str, ...] = ()) -> dict[str, Any]:
    """The `ModelConfig` fields every family reads the same way. `quant_methods`: the
    `quantization_config.quant_method`s the family's loader dequantises (others are refused)."""
    num_heads = int(required(cfg, "num_attention_heads"))
    hidden = int(required(cfg, "hidden_size"))
    refuse_unless(cfg, "partial_rotary_factor", lambda v: v in (None, 1, 1.0),
                  "rotary over part of each head")
    refuse_unless(cfg, "quantization_config",
                  lambda v: v is None or v.get("quant_method") in quant_methods,
                  "this pre-quantised format; use a GGUF or an unquantised checkpoint")
    return {
        "architecture": name,
        "num_layers": int(required(cfg, "num_hidden_layers")),
        "hidden_size": hidden,
        "intermediate_size": int(cfg.get("intermediate_size") or 0),
        "num_heads": num_heads,
        "num_kv_heads": int(cfg.get("num_key_value_heads") or num_heads),
        "head_dim": int(cfg.get("head_dim") or hidden // num_heads),
        "vocab_size": int(required(cfg, "vocab_size")),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": int(cfg.get("max_position_embeddings") or 4096),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", tie_default)),
    }


def rope_dict(cfg: HFConfig, layer_type: str | None = None) -> dict[str, Any]:
    """The rope parameters of `layer_type`'s layers (None: the model's one rope), legacy keys
    folded in as transformers' `standardize_rope_params` folds them."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if layer_type is not None and (FULL in params or SLIDING in params):
        params = params.get(layer_type) or {}
    elif FULL in params or SLIDING in params:
        params = params.get(FULL) or {}
    return dict(params)


def parse_rope(cfg: HFConfig, params: Mapping[str, Any],
               default_theta: float) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) of one rope-parameters dict; unknown `rope_type`s are refused."""
    theta = float(params.get("rope_theta") or cfg.get("rope_theta") or default_theta)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in ("linear", "llama3", "yarn"):
        raise UnsupportedModel(f"config.json's rope_type '{kind}' is not implemented; "
                               "supported: default, linear, llama3, yarn")
    if params.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise UnsupportedModel("config.json sets partial_rotary_factor, which radixgate does "
                               "not implement (rotary over part of each head)")
    original = int(params.get("original_max_position_embeddings")
                   or cfg.get("original_max_position_embeddings")
                   or cfg.get("max_position_embeddings") or 0)
    factor = params.get("factor")
    if factor is None:
        if kind != "yarn" or not original:
            raise UnsupportedModel(f"rope_type '{kind}' needs a factor")
        factor = int(cfg["max_position_embeddings"]) / original
    scaling = RopeScaling(
        kind=kind, factor=float(factor),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
        attention_factor=_float_or_none(params.get("attention_factor")),
        mscale=_float_or_none(params.get("mscale")),
        mscale_all_dim=_float_or_none(params.get("mscale_all_dim")))
    return theta, scaling


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def layer_types(cfg: HFConfig, num_layers: int, window: int | None) -> tuple[str, ...]:
    """`layer_types` as the config gives it; () when no layer slides (or no window is set, which
    transformers treats as full attention everywhere)."""
    types = cfg.get("layer_types")
    if window is None or not types:
        return ()
    if len(types) != num_layers:
        raise UnsupportedModel(f"layer_types has {len(types)} entries for {num_layers} layers")
    unknown = sorted(set(types) - {FULL, SLIDING})
    if unknown:
        raise UnsupportedModel(f"layer types {unknown} are not implemented; supported: "
                               f"{FULL}, {SLIDING}")
    return tuple(types) if SLIDING in types else ()
