"""Every model family against HF transformers (an implementation nobody here wrote), on tiny
random checkpoints that transformers 5 built and saved (tests/tiny_hf.py: weights at
initializer_range 0.2 so attention is peaked, zero- and one-initialised parameters redrawn,
8-token windows, 48-token prompts).

Through the paged engine: logits at every position of a prompt prefilled in chunks (one longer
than the CPU kernel's rows, one with a cached prefix), then decoded a token at a time, and of a
second prompt that reuses the first one's pages (a radix hit past the window), for every CPU
attention backend; then 32 greedy tokens through the engine (chunked prefill, prefix cache)
identical to transformers' `generate`. The packed CPU path (C row ops, oneDNN extends) is held
to the dense reference the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.attention.registry import get_backend
from engine.models.loader import default_dtype, load_model
from tests.engine.models.family_checks import (
    SHARED,
    backends,
    engine_turns,
    hf_generate,
    hf_model,
    max_logit_diff,
    paged_logits,
    prompts,
)
from tests.tiny_hf import build_tiny

transformers = pytest.importorskip("transformers")

# (test id, tiny_hf family, build options)
CASES = {
    "llama": ("llama", {}),
    "llama31": ("llama31", {}),  # rope_parameters with rope_type llama3 (transformers 5)
    "qwen2": ("qwen2", {}),
    "mistral": ("mistral", {}),
    "mistral_window": ("mistral", {"overrides": {"sliding_window": 8}}),
    "qwen3": ("qwen3", {}),
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe_fused": ("qwen3_moe", {"fused_experts": True}),
    "gemma3": ("gemma3", {}),
    "gpt_oss": ("gpt_oss", {}),
}
# |ours - transformers| over 48 positions x 49152 logits, fp32. Measured up to ~2e-5 (the
# experts' and attention's summation orders differ); logits have a standard deviation near 1.6.
LOGIT_ATOL = 2e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    built: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in built:
            family, options = CASES[case]
            built[case] = build_tiny(family, tmp_path_factory.mktemp(case), **options)
        return built[case]

    return get


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("case", list(CASES))
def test_paged_logits_match_transformers(case: str, backend: str,
                                         folders: Callable[[str], Path]) -> None:
    folder = folders(case)
    loaded = load_model(str(folder), "fp32", show_progress=False, packed=False)
    first, second = prompts(loaded.tokenizer.encode)
    hf = hf_model(folder)
    diff = max_logit_diff(loaded.model, backend, hf, first, second)
    print(f"{case}/{backend}: max |logit diff| {diff:.2e}")
    assert diff < LOGIT_ATOL


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_engine_greedy_equals_transformers_generate(case: str, packed: bool,
                                                    folders: Callable[[str], Path]) -> None:
    folder = folders(case)
    loaded = load_model(str(folder), "fp32", show_progress=False, packed=packed)
    first, second = prompts(loaded.tokenizer.encode)
    hf = hf_model(folder)
    results, second = engine_turns(loaded, first, second[SHARED:])
    assert results[1].cached_len >= len(first)  # the radix hit: the first turn and its output
    for ids, result in zip([first, second], results, strict=True):
        assert result.output_token_ids == hf_generate(hf, ids)


@pytest.mark.parametrize("case", list(CASES))
def test_packed_path_equals_dense(case: str, folders: Callable[[str], Path]) -> None:
    """The CPU row ops over oneDNN-packed extends (the default) against the torch reference."""
    folder = folders(case)
    dense = load_model(str(folder), "fp32", show_progress=False, packed=False)
    packed = load_model(str(folder), "fp32", show_progress=False, packed=True)
    assert packed.model.packed is not None
    first, second = prompts(dense.tokenizer.encode)
    backend = get_backend("torch")
    want = paged_logits(dense.model, backend, first, second)
    got = paged_logits(packed.model, backend, first, second)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_default_dtype_tracks_fp32(case: str, folders: Callable[[str], Path]) -> None:
    """The mode `--dtype auto` serves on this CPU (mixed precision where it has bf16
    instructions, else fp32), packed, against the fp32 reference: bf16 projections move logits
    by rounding, so the bound is on agreement, not equality."""
    folder = folders(case)
    dtype = default_dtype("cpu")
    dense = load_model(str(folder), "fp32", show_progress=False, packed=False)
    served = load_model(str(folder), dtype, show_progress=False, packed=True)
    first, second = prompts(dense.tokenizer.encode)
    backend = get_backend("torch")
    want = torch.cat(paged_logits(dense.model, backend, first, second))
    got = torch.cat(paged_logits(served.model, backend, first, second))
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    mean_diff = (got - want).abs().mean().item()
    print(f"{case} ({dtype}): argmax agreement {agree:.3f}, mean |logit diff| {mean_diff:.3f}")
    assert agree >= 0.9 and mean_diff <= 0.1
