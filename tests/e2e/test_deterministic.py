"""`--deterministic` on the real model in the machine's default dtype: the logits of every
generated token (its log-probability and the top 5) are the same bits whether the prefix came
from the cache or was recomputed, however prefill was chunked, whatever else shared the step,
with drafting on or off, and when the prefix was evicted and restored from the host tier. Turn 2's
prompt holds turn 1's reply, whose KV the cached engine computed by decoding and the uncached one
by prefill."""

from __future__ import annotations

import uuid

import pytest

from benchmarks.workload import stdlib_source
from engine.engine import Engine, EngineConfig
from engine.errors import InvalidRequest
from engine.models.loader import LoadedModel, default_dtype, load_model
from engine.protocol import Extend, Finished, TokenChunk
from engine.sampling_params import SamplingParams

Logits = list[tuple[list[float] | None, list[list[tuple[int, float]]] | None]]


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model(None, default_dtype("cpu"), show_progress=False)


@pytest.fixture(scope="module")
def text_ids(model: LoadedModel) -> list[int]:
    return model.tokenizer.encode(stdlib_source("textwrap.py"))


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


def _session(model: LoadedModel, ids: list[int], *, neighbours: int = 0, evict: bool = False,
             **config: object) -> tuple[list[int], Logits]:
    """Turn 1 (420 tokens, 20 generated), then turn 2 = turn 1 + reply + 180 new tokens (20
    generated), with `neighbours` unrelated requests running beside turn 2. `evict`: before
    turn 2, two unrelated prompts push turn 1's KV out of the pool (into the host tier, if
    the config has one)."""
    engine = Engine(model, EngineConfig(deterministic=True, check_invariants=True,
                                        **config))  # type: ignore[arg-type]
    first = _submit(engine, ids[:420], 20)
    reply, _ = _collect(engine.run_until_idle(), first)
    if evict:
        for start in (2000, 3000):
            _submit(engine, ids[start : start + 900], 1)
            engine.run_until_idle()
    for n in range(neighbours):
        _submit(engine, ids[1000 + 97 * n : 1000 + 97 * n + 50 + 31 * n], 12 + n)
    rid = _submit(engine, ids[:420] + reply + ids[420:600], 20)
    result = _collect(engine.run_until_idle(), rid)
    if evict and config.get("host_kv_memory_bytes"):
        assert engine.stats().num_host_restored_pages > 0, "turn 2 restored nothing"
    return result


def test_logits_do_not_depend_on_cache_chunking_batch_or_drafting(
        model: LoadedModel, text_ids: list[int]) -> None:
    want = _session(model, text_ids, spec="none")
    assert len(want[1]) == 20 and all(top for _, top in want[1])
    variants: dict[str, dict[str, object]] = {
        "no prefix cache": {"enable_prefix_cache": False, "spec": "none"},
        "chunks of 64": {"max_batch_tokens": 64, "spec": "none"},
        "chunks of 256, no cache": {"max_batch_tokens": 256, "enable_prefix_cache": False,
                                    "spec": "none"},
        "drafting on": {"spec": "suffix"},
    }
    for name, config in variants.items():
        assert _session(model, text_ids, **config) == want, name
    # Turn 1's KV evicted to the host tier and restored for turn 2 (a pool of 1,400 tokens,
    # whatever the KV dtype).
    config = model.model.config
    token_bytes = 2 * config.num_layers * config.kv_size * model.model.kv_dtype.itemsize
    small_pool = {"kv_memory_bytes": 1400 * token_bytes, "spec": "none"}
    assert _session(model, text_ids, evict=True, host_kv_memory_bytes=64 << 20,
                    **small_pool) == want, "host tier"
    assert _session(model, text_ids, evict=True, **small_pool) == want, "evicted, recomputed"
    for neighbours in (1, 3, 7):
        assert _session(model, text_ids, neighbours=neighbours, spec="none") == want, neighbours


def test_deterministic_refuses_what_it_cannot_run(model: LoadedModel) -> None:
    with pytest.raises(InvalidRequest, match="--no-packed-weights"):
        Engine(load_model(None, "fp32", show_progress=False, packed=False),
               EngineConfig(deterministic=True))
