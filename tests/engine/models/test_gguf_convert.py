"""The test fixtures themselves: tiny HF checkpoints (`tests.tiny_hf`), their GGUF conversion
(`tests.gguf_convert`) and the K-quant packers (`tests.gguf_kquants`), checked against transformers.

Measured with transformers 5.25 on CPU in fp32, 48-token prompt (logit std ~1.6 everywhere):
- f32 GGUF loaded by transformers vs the HF folder: max |d logits| = 0.0 (bit-identical) for
  llama, mistral, qwen2, qwen3, qwen3_moe and gemma3; the bound asserted is 1e-4.
- llama31: transformers' GGUF loader never reads `rope_freqs` (it maps only tensors that have an HF
  parameter, and its llama config mapping has no rope-scaling key), so its model is llama with
  plain theta-5e5 RoPE: 0.0 from HF with `rope_type` "default", 8.5 from the real HF model.
- llama at hidden 256 (real K-quant rows): q8_0 mean |d| 0.057, max 0.52, correlation 0.999;
  q4_k_m 0.75, 7.8, 0.82 (sharp random attention amplifies 4-bit noise: loose bounds).
transformers' GGUF reader also ignores qwen3's key_length (head_dim), qwen3moe's
expert_feed_forward_length, and has no key for gemma3's query_pre_attn_scalar: those are passed to
`from_pretrained` as config overrides (`LOAD_OVERRIDES`).

The file takes 30-45 s on 2 idle cores (slowest test ~4 s), so nothing is marked slow.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors import safe_open
from transformers import AutoModelForCausalLM, PreTrainedModel

from tests.gguf_convert import convert
from tests.gguf_kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from tests.tiny_hf import FAMILIES, build_tiny

Builder = Callable[..., Path]
# Build overrides a GGUF needs (module doc of tests.gguf_convert) and transformers' missing keys.
BUILD_OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"mlp_only_layers": []}, "gemma3": {"query_pre_attn_scalar": 16},
}
LOAD_OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen3": {"head_dim": 32}, "qwen3_moe": {"moe_intermediate_size": 32},
    "gemma3": {"query_pre_attn_scalar": 16},
}
WIDE = {"hidden_size": 256, "intermediate_size": 512}


def prompt(n: int = 48) -> torch.Tensor:
    """A fixed (1, n) prompt spread over the whole vocabulary."""
    return torch.tensor([[(i * 7919 + 13) % 49152 for i in range(n)]])


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    """`tiny(family, **overrides)`: the checkpoint folder, built once per session and arguments."""
    built: dict[str, Path] = {}

    def get(family: str, **overrides: Any) -> Path:
        key = f"{family}-{json.dumps(overrides, sort_keys=True)}"
        if key not in built:
            parent = tmp_path_factory.mktemp("tiny")
            built[key] = build_tiny(family, parent / family, overrides=overrides)
        return built[key]

    return get


def logits(model: PreTrainedModel, ids: torch.Tensor | None = None) -> torch.Tensor:
    """(positions, vocab) fp32 logits for `ids` (default `prompt()`)."""
    with torch.no_grad():
        out: torch.Tensor = model(prompt() if ids is None else ids).logits[0]
    return out


def hf_model(folder: Path, **overrides: Any) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **overrides)


def gguf_model(path: Path, **overrides: Any) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, **overrides)


def fields(path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...]]]]:
    """(metadata values, {tensor name: (type name, numpy shape)}) of a GGUF."""
    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    meta["n_tokens"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    shapes = {t.name: (t.tensor_type.name, tuple(int(n) for n in reversed(t.shape)))
              for t in reader.tensors}
    return meta, shapes


# ---- K-quant packers ---------------------------------------------------------------------------

@pytest.mark.parametrize(("quantize", "qtype", "levels", "rel_rms"), [
    (quantize_q4_k, Q.Q4_K, 15, 0.10), (quantize_q5_k, Q.Q5_K, 31, 0.05),
    (quantize_q6_k, Q.Q6_K, 31, 0.025),
])
def test_kquant_round_trip(quantize: Callable[[np.ndarray], np.ndarray], qtype: Q, levels: int,
                           rel_rms: float) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((32, 512)) * rng.uniform(0.01, 3.0, (32, 1))).astype(np.float32)
    x[1] = 0.0
    x[2, :256] = np.abs(x[2, :256]) + 1.0  # all positive: the min offset must clamp to zero
    x[3, 256:] = -0.5                      # constant block
    x[4, :32] *= 100.0                     # one loud sub-block beside quiet ones
    blocks = quantize(x)
    assert blocks.dtype == np.uint8
    assert blocks.shape == (32, 2 * gguf.GGML_QUANT_SIZES[qtype][1])
    y = gguf.quants.dequantize(blocks, qtype)
    xb, yb = x.reshape(-1, 256), y.reshape(-1, 256)
    # One code step of each 256-value block; a layout error would cost whole block ranges.
    if qtype == Q.Q6_K:
        step = np.abs(xb).max(axis=1) / levels
    else:
        step = (np.maximum(xb.max(axis=1), 0) - np.minimum(xb.min(axis=1), 0)) / levels
    assert np.all(np.abs(xb - yb).max(axis=1) <= 0.55 * step + 1e-7)
    assert np.sqrt(np.mean((x - y) ** 2) / np.mean(x**2)) < rel_rms
    with pytest.raises(ValueError, match="256"):
        quantize(np.zeros((2, 64), np.float32))


# ---- tiny checkpoints --------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_checkpoint_is_sane(tiny: Builder, family: str) -> None:
    folder = tiny(family)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in folder.iterdir()}
    model = hf_model(folder)
    out = logits(model)
    assert torch.isfinite(out).all() and 1.0 < float(out.std()) < 3.0
    ids = prompt(8)
    for _ in range(16):  # greedy, recomputing the prefix (`generate` costs seconds to set up)
        ids = torch.cat([ids, logits(model, ids)[-1:].argmax(-1, keepdim=True)], dim=1)
    assert len(set(ids[0, 8:].tolist())) >= 8, ids.tolist()  # not one token over and over


def test_build_is_deterministic(tmp_path: Path, tiny: Builder) -> None:
    again = build_tiny("llama", tmp_path / "llama")
    first = (tiny("llama") / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == first


def test_fused_experts_layout(tmp_path: Path) -> None:
    """Both qwen3_moe expert layouts hold the same weights and convert to the same GGUF bytes."""
    split = build_tiny("qwen3_moe", tmp_path / "a" / "moe", overrides={"mlp_only_layers": []})
    fused = build_tiny("qwen3_moe", tmp_path / "b" / "moe", overrides={"mlp_only_layers": []},
                       fused_experts=True)
    with safe_open(split / "model.safetensors", "pt") as f:
        assert f.get_slice("model.layers.0.mlp.experts.7.gate_proj.weight").get_shape() == [32, 64]
        assert f.get_slice("model.layers.0.mlp.experts.7.down_proj.weight").get_shape() == [64, 32]
    with safe_open(fused / "model.safetensors", "pt") as f:
        assert f.get_slice("model.layers.0.mlp.experts.gate_up_proj").get_shape() == [8, 64, 64]
        assert f.get_slice("model.layers.0.mlp.experts.down_proj").get_shape() == [8, 64, 32]
        assert not any(".experts.0." in k for k in f.keys())
    # The weights load bit-equal, yet grouped_mm rounds differently on the two loads (5e-6).
    torch.testing.assert_close(logits(hf_model(fused)), logits(hf_model(split)), rtol=0, atol=1e-5)
    a, b = convert(split, tmp_path / "a.gguf"), convert(fused, tmp_path / "b.gguf")
    assert a.read_bytes() == b.read_bytes()


def test_converter_refuses_what_gguf_cannot_say(tiny: Builder, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mlp_only_layers"):
        convert(tiny("qwen3_moe"), tmp_path / "moe.gguf")
    with pytest.raises(ValueError, match="query_pre_attn_scalar"):
        convert(tiny("gemma3"), tmp_path / "gemma.gguf")
    with pytest.raises(NotImplementedError, match="GptOss"):
        convert(tiny("gpt_oss"), tmp_path / "oss.gguf")


# ---- f32 GGUFs against transformers ------------------------------------------------------------

# arch, a few tensors with their numpy shapes (all F32 here), metadata values that must be there
EXPECTED: dict[str, tuple[str, dict[str, tuple[int, ...]], dict[str, Any]]] = {
    "llama": ("llama", {"blk.0.attn_q.weight": (64, 64), "output.weight": (49152, 64)},
              {"llama.rope.dimension_count": 16, "llama.attention.key_length": 16,
               "llama.vocab_size": 49152, "llama.rope.freq_base": 10000.0}),
    "mistral": ("llama", {"blk.0.attn_k.weight": (32, 64)}, {"general.name": "Mistral"}),
    "qwen2": ("qwen2", {"blk.0.attn_q.bias": (64,), "blk.0.attn_v.bias": (32,)},
              {"qwen2.attention.head_count_kv": 2}),
    "qwen3": ("qwen3", {"blk.0.attn_q.weight": (128, 64), "blk.0.attn_q_norm.weight": (32,)},
              {"qwen3.attention.key_length": 32, "qwen3.attention.value_length": 32}),
    "qwen3_moe": ("qwen3moe", {"blk.1.ffn_gate_exps.weight": (8, 32, 64),
                               "blk.1.ffn_down_exps.weight": (8, 64, 32),
                               "blk.1.ffn_gate_inp.weight": (8, 64)},
                  {"qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2,
                   "qwen3moe.expert_feed_forward_length": 32}),
    "gemma3": ("gemma3", {"blk.5.post_ffw_norm.weight": (64,), "blk.0.attn_k_norm.weight": (16,)},
               {"gemma3.attention.sliding_window": 8, "gemma3.rope.freq_base": 1e6,
                "gemma3.rope.freq_base_swa": 1e4, "gemma3.attention.key_length": 16}),
}


@pytest.mark.usefixtures("shared_reader")
@pytest.mark.parametrize("family", list(EXPECTED))
def test_f32_gguf_matches_hf(tiny: Builder, family: str) -> None:
    folder = tiny(family, **BUILD_OVERRIDES.get(family, {}))
    path = convert(folder, folder / "f32.gguf")
    want = logits(hf_model(folder))
    got = logits(gguf_model(path, **LOAD_OVERRIDES.get(family, {})))
    assert float((got - want).abs().max()) <= 1e-4  # measured 0.0

    meta, tensors = fields(path)
    arch, some_tensors, some_meta = EXPECTED[family]
    assert meta["general.architecture"] == arch and meta["n_tokens"] == 49152
    for name, shape in some_tensors.items():
        assert tensors[name] == ("F32", shape), name
    for key, value in some_meta.items():
        expected = pytest.approx(value) if isinstance(value, float) else value
        assert meta[key] == expected, key
    assert ("output.weight" in tensors) == (family in ("llama", "mistral", "qwen3_moe"))
    assert not any(k.startswith(f"{arch}.rope.scaling") for k in meta)


@pytest.mark.usefixtures("shared_reader")
def test_llama31_rope_freqs(tiny: Builder, tmp_path: Path) -> None:
    """transformers ignores rope_freqs, so check the factors against HF's llama3 inv_freq."""
    folder = tiny("llama31")
    reader = gguf.GGUFReader(convert(folder, tmp_path / "llama31.gguf"))
    factors = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
    assert factors.tensor_type == Q.F32
    rope_freqs = torch.from_numpy(np.array(factors.data, dtype=np.float32))
    assert not any(k.startswith("llama.rope.scaling") for k in reader.fields)
    plain = 1.0 / 500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    inv_freq_hf = hf_model(folder).model.rotary_emb.inv_freq
    torch.testing.assert_close(inv_freq_hf, plain / rope_freqs, rtol=1e-6, atol=0)
    # All three branches of the llama3 formula: kept, smoothed, divided by the factor.
    assert rope_freqs[0] == 1 and rope_freqs[-1] == 8 and 1 < float(rope_freqs[2]) < 8


@pytest.mark.usefixtures("shared_reader")
def test_llama31_gguf_in_transformers_is_plain_rope(tiny: Builder, tmp_path: Path) -> None:
    folder = tiny("llama31")
    got = logits(gguf_model(convert(folder, tmp_path / "llama31.gguf")))
    plain = hf_model(folder, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    assert float((got - logits(plain)).abs().max()) <= 1e-4  # measured 0.0
    assert float((got - logits(hf_model(folder))).abs().max()) > 1.0  # measured 8.5


# ---- quantised GGUFs ---------------------------------------------------------------------------

Q4_K_M_TYPES = {  # llama, 4 layers, hidden 256: use_more_bits picks layers 2 and 3
    "token_embd.weight": "Q4_K", "output.weight": "Q6_K", "blk.0.attn_v.weight": "Q4_K",
    "blk.2.attn_v.weight": "Q6_K", "blk.1.ffn_down.weight": "Q4_K", "blk.3.ffn_down.weight": "Q6_K",
    "blk.0.attn_q.weight": "Q4_K", "blk.0.ffn_gate.weight": "Q4_K",
    "blk.0.attn_output.weight": "Q5_0",  # rows of heads*head_dim = 64: Q4_K's fallback
    "blk.0.attn_norm.weight": "F32",
}


@pytest.mark.usefixtures("shared_reader")
@pytest.mark.parametrize(("qtype", "mean_bound", "max_bound", "min_corr"), [
    ("q8_0", 0.1, 1.0, 0.99),   # measured mean |d| 0.057, max 0.52, correlation 0.999
    ("q4_k_m", 1.0, 12.0, 0.7),  # measured 0.75, 7.8, 0.82 (logit std 1.6)
])
def test_quantised_gguf_close_to_f32(tiny: Builder, qtype: str, mean_bound: float,
                                     max_bound: float, min_corr: float) -> None:
    folder = tiny("llama", **WIDE)
    path = convert(folder, folder / f"{qtype}.gguf", qtype=qtype)
    want = logits(hf_model(folder))  # the f32 GGUF's logits: identical (test above)
    got = logits(gguf_model(path))
    diff = (got - want).abs()
    assert float(diff.mean()) < mean_bound and float(diff.max()) < max_bound
    assert float(torch.corrcoef(torch.stack([got.flatten(), want.flatten()]))[0, 1]) > min_corr
    meta, tensors = fields(path)
    if qtype == "q8_0":
        assert meta["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
        assert {t for t, shape in tensors.values() if len(shape) == 2} == {"Q8_0"}
    else:
        assert meta["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_K_M
        assert {name: tensors[name][0] for name in Q4_K_M_TYPES} == Q4_K_M_TYPES
