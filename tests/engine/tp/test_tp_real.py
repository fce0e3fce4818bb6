"""The embedded SmolLM2-135M (Q4_1 GGUF, 9 heads, 3 KV heads) split over 3 ranks decodes the
same greedy tokens as on one; 2 ranks cannot split it."""

from __future__ import annotations

import pytest

from engine.engine import Engine, EngineConfig
from engine.errors import InvalidParallelism
from engine.models.loader import load_model
from tests.engine.tp.tp_runs import greedy


@pytest.mark.slow
def test_smollm2_tp3_greedy_equals_tp1() -> None:
    loaded = load_model(None, "fp32", show_progress=False)
    with pytest.raises(InvalidParallelism, match="9 attention heads, 3 KV heads"):
        Engine(loaded, EngineConfig(tp=2))
    reference = greedy(loaded, tp=1, max_tokens=16, kv_memory_bytes=16 << 20)
    assert greedy(loaded, tp=3, max_tokens=16, kv_memory_bytes=16 << 20) == reference
