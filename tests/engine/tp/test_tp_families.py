"""`--tp 2` greedy output equals `--tp 1` for every family, on tiny random checkpoints (HF
folders, fp32: dense decodes and oneDNN extends) and on quantised GGUFs (the codes kernel)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.models.ggml_weight import GgmlWeight
from engine.models.loader import load_model
from tests.engine.tp.tp_runs import greedy
from tests.gguf_convert import convert
from tests.tiny_hf import FAMILIES, build_tiny


@pytest.mark.parametrize("family", FAMILIES)
def test_tp2_greedy_equals_tp1(family: str, tmp_path: Path) -> None:
    loaded = load_model(str(build_tiny(family, tmp_path / family)), "fp32", show_progress=False)
    reference = greedy(loaded, tp=1)
    assert greedy(loaded, tp=2) == reference


# q8_0 at hidden 64: o's 32 columns a rank keep their codes, down's 48 fall back to fp32.
# q4_k_m at hidden 256: Q4_K codes split on super-blocks of 256 where they can, Q6_K and Q5_0
# beside them; the rest fall back to fp32 slices.
QUANTISED: list[tuple[str, dict[str, Any]]] = [
    ("q8_0", {}), ("q4_k_m", {"hidden_size": 256, "intermediate_size": 512})]


@pytest.mark.parametrize(("qtype", "overrides"), QUANTISED, ids=[q for q, _ in QUANTISED])
def test_quantised_tp2_greedy_equals_tp1(qtype: str, overrides: dict[str, Any],
                                          tiny_llama: Path, tmp_path: Path) -> None:
    folder = build_tiny("llama", tmp_path / "llama", overrides=overrides) if overrides else (
        tiny_llama)
    loaded = load_model(str(convert(folder, tmp_path / f"{qtype}.gguf", qtype=qtype)), "fp32",
                        show_progress=False)
    packed = loaded.model.packed
    assert packed is not None and isinstance(packed.decode_layers[0].qkv, GgmlWeight)
    reference = greedy(loaded, tp=1)
    assert greedy(loaded, tp=2) == reference
