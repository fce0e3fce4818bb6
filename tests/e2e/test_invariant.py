"""The default mode (no `--deterministic`), in the machine's default dtype: a token's logits (its
log-probability and the top 5) are the same bits whether its prefix came from the cache or was
recomputed, however prefill was chunked (64, 256, 1024 tokens a step), whatever unrelated
requests shared the step (batch 1-8), and with drafting on or off.

That holds by construction where every projection runs from GGUF codes (one summation order per
output row, docs/ggml_kernels.md), the row ops work per row, and the attention kernel keeps a
fixed per-row order (engine/attention/csrc/row_math.h). The embedded SmolLM2 runs here in the
default tier; Qwen2.5-Coder-1.5B, the default model, in the real-model tier.
"""

from __future__ import annotations

import uuid

import pytest

from benchmarks.workload import stdlib_source
from engine.engine import Engine, EngineConfig
from engine.models.ggml_weight import GgmlWeight
from engine.models.loader import LoadedModel, default_dtype, load_model
from engine.models.weights import projections
from engine.protocol import Extend, Finished, TokenChunk
from engine.sampling_params import SamplingParams

Logits = list[tuple[list[float] | None, list[list[tuple[int, float]]] | None]]
GENERATED = 16


def _submit(engine: Engine, prompt: list[int], max_tokens: int) -> str:
    rid = uuid.uuid4().hex
    engine.submit(Extend(rid, "t", None, prompt, SamplingParams(
        max_tokens=max_tokens, logprobs=5, ignore_eos=True)))
    return rid


def _collect(messages: list[object], rid: str) -> tuple[list[int], Logits]:
    ours = [m for m in messages if getattr(m, "request_id", None) == rid]
    (done,) = [m for m in ours if isinstance(m, Finished)]
    return done.output_token_ids, [(m.logprobs, m.top_logprobs) for m in ours
                                   if isinstance(m, TokenChunk)]


def _session(model: LoadedModel, ids: list[int], *, neighbours: int = 0,
             **config: object) -> tuple[list[int], Logits]:
    """Turn 1 (420 tokens, GENERATED more), then turn 2 = turn 1 + reply + 300 new tokens
    (GENERATED more), with `neighbours` unrelated requests running beside turn 2. Turn 2's
    prompt holds turn 1's reply, whose KV the cached engine computed by decoding and an
    uncached one by prefill."""
    engine = Engine(model, EngineConfig(check_invariants=True,
                                        **config))  # type: ignore[arg-type]
    first = _submit(engine, ids[:420], GENERATED)
    reply, _ = _collect(engine.run_until_idle(), first)
    for n in range(neighbours):
        _submit(engine, ids[1000 + 97 * n : 1000 + 97 * n + 50 + 31 * n], 10 + n)
    rid = _submit(engine, ids[:420] + reply + ids[420:720], GENERATED)
    return _collect(engine.run_until_idle(), rid)


def _check(model: LoadedModel, ids: list[int], neighbour_counts: tuple[int, ...]) -> None:
    packed = model.model.packed
    assert packed is not None
    assert all(isinstance(w, GgmlWeight) for layer in packed.decode_layers
               for w in projections(layer)), "a projection is not read from its codes"
    want = _session(model, ids, spec="none")
    assert len(want[1]) == GENERATED and all(top for _, top in want[1])
    variants: dict[str, dict[str, object]] = {
        "no prefix cache": {"enable_prefix_cache": False, "spec": "none"},
        "chunks of 64": {"max_batch_tokens": 64, "spec": "none"},
        "chunks of 256, no cache": {"max_batch_tokens": 256, "enable_prefix_cache": False,
                                    "spec": "none"},
        "chunks of 1024, no cache": {"max_batch_tokens": 1024, "enable_prefix_cache": False,
                                     "spec": "none"},
        "drafting on": {"spec": "suffix"},
    }
    for name, config in variants.items():
        assert _session(model, ids, **config) == want, name
    for neighbours in neighbour_counts:
        assert _session(model, ids, neighbours=neighbours, spec="none") == want, neighbours


def _load(name: str) -> tuple[LoadedModel, list[int]]:
    loaded = load_model(name, default_dtype("cpu"), show_progress=False)
    return loaded, loaded.tokenizer.encode(stdlib_source("textwrap.py"))


def test_embedded_model_logits_do_not_depend_on_cache_chunks_batch_or_drafting() -> None:
    _check(*_load("smollm2-135m"), neighbour_counts=(1, 3, 7))


@pytest.mark.slow
@pytest.mark.real_model
def test_default_model_logits_do_not_depend_on_cache_chunks_batch_or_drafting() -> None:
    _check(*_load("qwen2.5-coder-1.5b"), neighbour_counts=(1, 7))
