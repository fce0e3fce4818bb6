"""GGUF files of every GGUF family against transformers loading the same file: the tiny HF
checkpoints (tests/tiny_hf.py) converted as llama.cpp's converter lays them out
(tests/gguf_convert.py: `llama` with its Q/K rows permuted and Llama 3.1's `rope_freqs`, `qwen2`
unpermuted with q/k/v biases, `qwen3`, `qwen3moe` with stacked experts, `gemma3` with its norms
stored + 1), in F32, F16, BF16 and quantised types (Q8_0, Q4_0, Q5_K, and a Q4_K_M mix of Q4_K,
Q6_K and their small-row fallbacks Q5_0/Q5_1). transformers dequantises with gguf's numpy
code; the values are the same, so the logits must agree as closely as for fp32 files.

transformers' GGUF reader ignores a few keys (qwen3's key_length, qwen3moe's
expert_feed_forward_length, and no key carries gemma3's query_pre_attn_scalar): they are passed
to it as config overrides. It also ignores `rope_freqs`, so Llama 3.1 is checked against the HF
checkpoint it was converted from instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.models.loader import load_model
from engine.tokenizer_gguf import read_gguf_tensors
from tests.engine.models.family_checks import (
    SHARED,
    engine_greedy,
    engine_turns,
    hf_generate,
    hf_model,
    max_logit_diff,
    prompts,
)
from tests.gguf_convert import convert
from tests.tiny_hf import build_tiny

pytest.importorskip("transformers")

WIDE = {"hidden_size": 256, "intermediate_size": 512}  # rows K-quant blocks (256) fit
# id: (family, build overrides, qtype, transformers' config overrides)
CASES: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
    "llama": ("llama", {}, "f32", {}),
    "mistral": ("mistral", {}, "f32", {}),
    "qwen2": ("qwen2", {}, "f32", {}),
    "qwen3": ("qwen3", {}, "f32", {"head_dim": 32}),
    "qwen3_moe": ("qwen3_moe", {"mlp_only_layers": []}, "f32", {"moe_intermediate_size": 32}),
    "gemma3": ("gemma3", {"query_pre_attn_scalar": 16}, "f32", {"query_pre_attn_scalar": 16}),
    "llama_f16": ("llama", {}, "f16", {}),
    "qwen3_bf16": ("qwen3", {}, "bf16", {"head_dim": 32}),
    "llama_q8_0": ("llama", {}, "q8_0", {}),
    "qwen2_q4_0": ("qwen2", {}, "q4_0", {}),
    "llama_q4_k_m": ("llama", WIDE, "q4_k_m", {}),
    "qwen3_q4_k_m": ("qwen3", WIDE, "q4_k_m", {"head_dim": 32}),
    "qwen2_q5_k": ("qwen2", WIDE, "q5_k", {}),
    "gemma3_q4_k_m": ("gemma3", {**WIDE, "query_pre_attn_scalar": 16}, "q4_k_m",
                      {"query_pre_attn_scalar": 16}),
}
# Measured up to ~4e-5 (summation order); logits have a standard deviation near 1.6.
LOGIT_ATOL = 2e-4


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    built: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in built:
            family, overrides, qtype, _ = CASES[case]
            folder = build_tiny(family, tmp_path_factory.mktemp(case), overrides=overrides)
            built[case] = convert(folder, folder / f"{case}.gguf", qtype=qtype)
        return built[case]

    return get


@pytest.mark.usefixtures("shared_reader")
@pytest.mark.parametrize("case", list(CASES))
def test_gguf_logits_match_transformers_on_the_same_file(
        case: str, ggufs: Callable[[str], Path]) -> None:
    path = ggufs(case)
    types = {t.tensor_type.name for t in read_gguf_tensors(path).values()}
    loaded = load_model(str(path), "fp32", show_progress=False, packed=False)
    first, second = prompts(loaded.tokenizer.encode)
    hf = hf_model(path.parent, gguf_file=path.name, **CASES[case][3])
    for backend in ("torch", "cpu"):
        diff = max_logit_diff(loaded.model, backend, hf, first, second)
        print(f"{case} ({', '.join(sorted(types))}) / {backend}: max |logit diff| {diff:.2e}")
        assert diff < LOGIT_ATOL


@pytest.mark.usefixtures("shared_reader")
@pytest.mark.parametrize("case", ["llama_q8_0", "qwen2_q4_0", "llama_q4_k_m", "gemma3_q4_k_m"])
def test_packed_codes_greedy_equals_transformers(case: str,
                                                 ggufs: Callable[[str], Path]) -> None:
    """Decodes on the GGUF's own codes (Q8_0, Q4_0, Q4_K in the kernel's forms), extends on
    oneDNN-packed weights: the same 32 greedy tokens as transformers on the same file."""
    path = ggufs(case)
    loaded = load_model(str(path), "fp32", show_progress=False, packed=True)
    assert loaded.model.packed is not None and loaded.model.packed.nbytes > 0
    first, second = prompts(loaded.tokenizer.encode)
    hf = hf_model(path.parent, gguf_file=path.name, **CASES[case][3])
    results, second = engine_turns(loaded, first, second[SHARED:])
    assert results[1].cached_len >= len(first)
    for ids, result in zip([first, second], results, strict=True):
        assert result.output_token_ids == hf_generate(hf, ids)


def test_llama31_rope_freqs_are_applied(tmp_path: Path) -> None:
    """The converter turns Llama 3.1's llama3 rope into a `rope_freqs` tensor; ours must give
    the logits of the HF checkpoint it came from (transformers' GGUF reader drops it)."""
    folder = build_tiny("llama31", tmp_path / "llama31")
    path = convert(folder, folder / "llama31.gguf")
    assert "rope_freqs.weight" in read_gguf_tensors(path)
    loaded = load_model(str(path), "fp32", show_progress=False, packed=False)
    assert loaded.model.config.rope_freq_factors is not None
    first, second = prompts(loaded.tokenizer.encode)
    hf = hf_model(folder)
    diff = max_logit_diff(loaded.model, "torch", hf, first, second)
    assert diff < LOGIT_ATOL, diff
    results = engine_greedy(loaded, [first])
    assert results[0].output_token_ids == hf_generate(hf, first)
