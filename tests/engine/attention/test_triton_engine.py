"""The engine with the Triton backend (interpreter on CPU) generates what the torch backend does."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from engine.attention.registry import get_backend  # noqa: E402
from engine.engine import Engine, EngineConfig  # noqa: E402
from engine.models.loader import LoadedModel, load_model  # noqa: E402
from engine.protocol import Extend, Finished, Message  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("engine runs on CPU: needs TRITON_INTERPRET=1", allow_module_level=True)


def generate(loaded: LoadedModel, backend: str, prompts: list[list[int]], max_tokens: int,
             **config: object) -> dict[str, list[int]]:
    engine = Engine(loaded, EngineConfig(attention_backend=backend, **config))  # type: ignore[arg-type]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.submit(Extend(f"r{i}", "ns", None, ids, params))
    out: list[Message] = engine.run_until_idle()
    return {m.request_id: m.output_token_ids for m in out if isinstance(m, Finished)}


def test_registry_knows_triton_and_auto() -> None:
    assert get_backend("triton").name == "triton"
    from engine.attention.cpu_paged import kernel

    cpu_choice = "cpu" if kernel() is not None else "torch"
    expected = cpu_choice if not torch.cuda.is_available() else get_backend("auto").name
    assert get_backend("auto").name == expected


def test_tiny_model_triton_equals_torch(tiny: LoadedModel) -> None:
    # Page size 4 and a 16-token step budget: chunked prefill over cached pages, then batched
    # decode of three sequences of different lengths.
    prompts = [[100 + (7 * i) % 500 for i in range(n)] for n in (21, 3, 9)]
    config = {"page_size": 4, "kv_memory_bytes": 4 << 20, "max_batch_tokens": 16}
    want = generate(tiny, "torch", prompts, 6, **config)
    assert generate(tiny, "triton", prompts, 6, **config) == want


@pytest.mark.slow
def test_real_model_triton_equals_torch() -> None:
    loaded = load_model(None, show_progress=False)
    prompt = loaded.tokenizer.encode("The capital of France is a city where people")[:20]
    config = {"kv_memory_bytes": 64 << 20}
    want = generate(loaded, "torch", [prompt], 4, **config)
    assert generate(loaded, "triton", [prompt], 4, **config) == want
