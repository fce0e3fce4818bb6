"""Rotary frequencies against transformers' own `ROPE_INIT_FUNCTIONS`, for every rope type the
configs may name, from the config fields as the families parse them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.config import Rope
from engine.errors import UnsupportedModel
from engine.models.families.hf_config import parse_rope, rope_dict
from engine.models.rope import inverse_frequencies, rotary_tables

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HEAD_DIM = 64
BASE: dict[str, Any] = {"hidden_size": 512, "num_attention_heads": 8, "head_dim": HEAD_DIM,
                        "max_position_embeddings": 8192}

CASES: list[tuple[str, dict[str, Any]]] = [
    ("default", {"rope_type": "default", "rope_theta": 10000.0}),
    ("linear", {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}),
    ("llama3", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}),
    ("yarn", {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
              "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False}),
    ("yarn", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
              "original_max_position_embeddings": 32768}),
    ("yarn", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0,
              "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}),
]


@pytest.mark.parametrize(("kind", "params"), CASES)
def test_frequencies_equal_transformers(kind: str, params: dict[str, Any]) -> None:
    hf_config = transformers.LlamaConfig(**BASE, rope_parameters=dict(params))
    init = ROPE_INIT_FUNCTIONS.get(kind)
    if init is None:  # "default" has no entry: theta ** (-2i/d)
        want = 1.0 / (params["rope_theta"] ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        want_factor = 1.0
    else:
        want, want_factor = init(hf_config)
    theta, scaling = parse_rope(hf_config.to_dict(), rope_dict(hf_config.to_dict()), 10000.0)
    got, got_factor = inverse_frequencies(Rope(theta, scaling), HEAD_DIM)
    assert torch.equal(got, want.float())
    assert got_factor == pytest.approx(want_factor, rel=1e-12)


def test_legacy_rope_scaling_keys_read_as_rope_parameters() -> None:
    """Configs on the Hub keep rope_theta at the top level and `rope_scaling` with `type`."""
    legacy = {**BASE, "rope_theta": 500000.0, "rope_scaling": {
        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}
    theta, scaling = parse_rope(legacy, rope_dict(legacy), 10000.0)
    assert theta == 500000.0 and scaling is not None and scaling.kind == "llama3"


def test_freq_factors_divide_the_frequencies() -> None:
    """llama.cpp's rope_freqs: the llama3 scaling as one factor per frequency."""
    plain, _ = inverse_frequencies(Rope(500000.0), HEAD_DIM)
    factors = tuple(float(x) for x in torch.linspace(1, 8, HEAD_DIM // 2))
    scaled, _ = inverse_frequencies(Rope(500000.0, freq_factors=factors), HEAD_DIM)
    assert torch.allclose(scaled, plain / torch.tensor(factors))


def test_tables_hold_the_attention_factor() -> None:
    _, params = CASES[3]
    theta, scaling = parse_rope(params, params, 10000.0)
    cos, sin = rotary_tables(Rope(theta, scaling), HEAD_DIM, 16, torch.float32)
    assert scaling is not None
    factor = 0.1 * torch.log(torch.tensor(32.0)).item() + 1.0
    torch.testing.assert_close(cos[0], torch.full((HEAD_DIM,), factor))
    torch.testing.assert_close(cos.pow(2) + sin.pow(2), torch.full((16, HEAD_DIM), factor ** 2))


@pytest.mark.parametrize("kind", ["dynamic", "longrope", "su"])
def test_unknown_rope_types_are_refused_by_name(kind: str) -> None:
    params = {"rope_type": kind, "factor": 2.0}
    with pytest.raises(UnsupportedModel, match=kind):
        parse_rope({}, params, 10000.0)
