"""Speculative decoding in the engine on a tiny random model: greedy output identical with
drafting off, for the suffix drafter and the draft-model drafter; KV stays consistent."""

from __future__ import annotations

import pytest

from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams
from engine.spec.model_drafter import ModelDrafter
from engine.spec.speculator import Speculator


def make_engine(loaded: LoadedModel, spec: str, **overrides: object) -> Engine:
    base = {"page_size": 4, "kv_memory_bytes": 8 << 20, "max_batch_tokens": 64,
            "check_invariants": True, "spec": spec}
    return Engine(loaded, EngineConfig(**{**base, **overrides}))  # type: ignore[arg-type]


def repetitive_prompts(loaded: LoadedModel) -> list[list[int]]:
    tok = loaded.tokenizer
    texts = ['{"name": "read_file", "arguments": {"path": "src/app.py"}}\n' * 3,
             "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
             "one two three four five one two three",
             "no repetition here at all"]
    return [tok.encode(t) for t in texts]


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams,
        session: str | None = None) -> dict[str, Finished]:
    for i, ids in enumerate(prompts):
        engine.submit(Extend(f"r{i}", "ns", None, ids, params, session_id=session))
    return {m.request_id: m for m in engine.run_until_idle() if isinstance(m, Finished)}


def assert_pool_baseline(engine: Engine) -> None:
    engine.check_invariants()
    engine.reset_cache()
    assert engine.page_pool.num_free_pages == engine.page_pool.num_pages


@pytest.mark.parametrize("max_batch_tokens", [64, 5])
def test_suffix_drafting_keeps_greedy_output(tiny: LoadedModel, max_batch_tokens: int) -> None:
    """A random model rarely repeats itself, but a retry in the same session re-emits what the
    first try produced: the second pass drafts from the session's corpus and is accepted."""
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompts = repetitive_prompts(tiny)
    plain = run(make_engine(tiny, "none", max_batch_tokens=max_batch_tokens), prompts, params)
    engine = make_engine(tiny, "suffix", max_batch_tokens=max_batch_tokens)
    for _ in range(2):
        spec = run(engine, prompts, params, session="s1")
        for rid, done in plain.items():
            assert spec[rid].output_token_ids == done.output_token_ids, rid
            assert spec[rid].num_accepted <= spec[rid].num_drafted
    assert all(done.num_accepted > 0 for done in spec.values())
    stats = engine.stats()
    assert stats.num_accepted > 0.8 * stats.num_drafted
    assert_pool_baseline(engine)


def test_suffix_drafting_with_stops_and_small_pool(tiny: LoadedModel) -> None:
    """Stop strings, stop tokens and preemption under a tiny KV budget, drafting on and off."""
    prompts = repetitive_prompts(tiny) * 3
    params = SamplingParams(max_tokens=30, stop=("a",), ignore_eos=True)
    kw = {"kv_memory_bytes": 40 * 4 * 2 * 2 * 16 * 4 * 2}  # 80 pages of 4 tokens
    plain = run(make_engine(tiny, "none", **kw), prompts, params)
    engine = make_engine(tiny, "suffix", **kw)
    spec = run(engine, prompts, params)
    for rid, done in plain.items():
        assert (spec[rid].output_token_ids, spec[rid].text, spec[rid].finish_reason) == (
            done.output_token_ids, done.text, done.finish_reason), rid
    assert_pool_baseline(engine)


def test_draft_model_drafter_keeps_greedy_output(tiny: LoadedModel) -> None:
    """The target itself as the draft model: drafts are almost always accepted."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(tiny)
    plain = run(make_engine(tiny, "none"), prompts, params)
    engine = make_engine(tiny, "none")
    engine.speculator = Speculator(ModelDrafter(tiny, 4, kv_memory_bytes=4 << 20), 4)
    spec = run(engine, prompts, params)
    for rid, done in plain.items():
        assert spec[rid].output_token_ids == done.output_token_ids, rid
    stats = engine.stats()
    assert stats.num_accepted >= 0.9 * stats.num_drafted > 0
    assert engine.speculator.drafter.pool.num_used_pages == 0  # type: ignore[attr-defined]
    assert_pool_baseline(engine)


def test_unknown_spec_mode_is_rejected(tiny: LoadedModel) -> None:
    from engine.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="speculative mode"):
        make_engine(tiny, "eagle")


@pytest.mark.parametrize("drafter", ["suffix", "model"])
def test_fail_all_returns_pages_and_drafter_state(tiny: LoadedModel, drafter: str) -> None:
    """A step that raises fails every request through the finish path: pool pages, the draft
    model's KV and the drafter's per-request state all return to their baseline."""
    engine = make_engine(tiny, "suffix" if drafter == "suffix" else "none")
    if drafter == "model":
        engine.speculator = Speculator(ModelDrafter(tiny, 4, kv_memory_bytes=4 << 20), 4)
    assert engine.speculator is not None
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompts = repetitive_prompts(tiny)
    for i, ids in enumerate(prompts):
        engine.submit(Extend(f"r{i}", "ns", None, ids, params, session_id="s"))
    for _ in range(8):  # every request is decoding; drafts proposed where the context allows
        engine.step()
    assert engine.has_work
    spec_drafter = engine.speculator.drafter
    if drafter == "model":
        assert engine.stats().num_drafted > 0
    else:
        assert len(spec_drafter._requests) == len(prompts)  # type: ignore[attr-defined]
    failed = engine.fail_all("engine_error", "boom")
    assert sorted(m.request_id for m in failed) == [f"r{i}" for i in range(len(prompts))]
    assert not engine.has_work and engine.stats().num_finished == len(prompts)
    engine.check_invariants()
    if drafter == "model":
        assert spec_drafter.pool.num_used_pages == 0  # type: ignore[attr-defined]
    else:
        assert not spec_drafter._requests  # type: ignore[attr-defined]
    engine.reset_cache()
    assert engine.page_pool.num_free_pages == engine.page_pool.num_pages
