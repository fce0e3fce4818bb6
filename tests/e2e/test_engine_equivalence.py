"""Greedy output with the prefix cache on == cache off == the dense reference, on the real model.

Covers a 12-turn chain, a fork, a rewind-and-branch, 8 concurrent sessions, and a KV budget small
enough to force eviction and preemption. After each scenario the page pool is back to baseline.
"""

from __future__ import annotations

import pytest

from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.sampling_params import SamplingParams
from tests.e2e.turns import Turn, TurnDriver, reference_turn

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
SYSTEM = ("<|im_start|>system\nYou are a coding agent. Tools: read_file(path), run(cmd). "
          "Answer briefly.<|im_end|>\n")
USER_TEXTS = [
    "List the files in the repository.",
    "Open setup.py and tell me the package name.",
    "The test in tests/test_io.py fails with KeyError: 'path'. Why?",
    "def load(cfg):\n    return cfg['path']\nFix this function so a missing key gives None.",
    "Run pytest -q and summarise the result.",
    "Now add a docstring to load().",
    "What does os.path.join('a', 'b') return on Linux?",
    "Write a shell command that counts lines in all .py files.",
    "Rename the variable cfg to config everywhere.",
    "Explain what a radix tree is in one sentence.",
    "Is 2**10 equal to 1024?",
    "Finish with a one-line summary of the changes.",
]


def user_delta(loaded: LoadedModel, text: str, first: bool) -> list[int]:
    opener = SYSTEM if first else "<|im_end|>\n"
    return loaded.tokenizer.encode(f"{opener}<|im_start|>user\n{text}<|im_end|>\n"
                                   "<|im_start|>assistant\n")


def make_engine(loaded: LoadedModel, *, cache: bool, kv_mib: int = 64,
                max_batch_tokens: int = 256) -> Engine:
    return Engine(loaded, EngineConfig(page_size=16, kv_memory_bytes=kv_mib << 20,
                                       max_batch_tokens=max_batch_tokens,
                                       enable_prefix_cache=cache, check_invariants=True))


def assert_pool_baseline(engine: Engine) -> None:
    """No request holds pages: every used page belongs to the cache; dropping it frees all."""
    engine.check_invariants()
    assert engine.page_pool.num_used_pages == engine.cache.num_cached_pages
    engine.reset_cache()
    assert engine.page_pool.num_free_pages == engine.page_pool.num_pages


def run_chain(loaded: LoadedModel, driver: TurnDriver, texts: list[str],
              parent: Turn | None = None) -> list[Turn]:
    turns = []
    for i, text in enumerate(texts):
        turn = driver.run(parent, user_delta(loaded, text, parent is None and i == 0), GREEDY)
        turns.append(turn)
        parent = turn
    return turns


def test_chain_fork_rewind_match_reference(loaded_model: LoadedModel) -> None:
    cached = TurnDriver(make_engine(loaded_model, cache=True))
    uncached = TurnDriver(make_engine(loaded_model, cache=False), full_path=True)
    chain = run_chain(loaded_model, cached, USER_TEXTS)
    plain = run_chain(loaded_model, uncached, USER_TEXTS)
    for i, (a, b) in enumerate(zip(chain, plain, strict=True)):
        assert a.output_ids == b.output_ids, f"turn {i}: cache on/off differ"
        assert a.path == b.path
    # Every turn after the first reused its parent's KV, up to the partial last page.
    for parent, turn in zip(chain, chain[1:], strict=False):
        assert turn.finished.cached_len >= len(parent.path) - 16
        assert turn.finished.computed_len == turn.finished.prompt_len - turn.finished.cached_len
    # The dense reference agrees at every turn.
    parent_path: list[int] = []
    for i, (text, turn) in enumerate(zip(USER_TEXTS, chain, strict=True)):
        delta = user_delta(loaded_model, text, i == 0)
        assert reference_turn(loaded_model, parent_path, delta, GREEDY) == turn.output_ids, i
        parent_path = turn.path

    # Fork from turn 5, continued differently; rewind to turn 3 and branch anew.
    for base_idx, text in ((4, "Instead, delete the tests directory."),
                           (2, "Start over: what language is this repository written in?")):
        base = chain[base_idx]
        delta = user_delta(loaded_model, text, False)
        forked = cached.run(base, delta, GREEDY)
        assert forked.finished.cached_len >= len(base.path) - 16
        assert forked.output_ids == uncached.run(plain[base_idx], delta, GREEDY).output_ids
        assert forked.output_ids == reference_turn(loaded_model, base.path, delta, GREEDY)
    assert_pool_baseline(cached.engine)
    assert_pool_baseline(uncached.engine)


def test_concurrent_sessions_match_reference(loaded_model: LoadedModel) -> None:
    engine = make_engine(loaded_model, cache=True)
    driver = TurnDriver(engine)
    params = SamplingParams(max_tokens=10)
    deltas = [user_delta(loaded_model, text, True) for text in USER_TEXTS[:8]]
    request_ids = [driver.submit(None, delta, params) for delta in deltas]
    turns = driver.collect(engine.run_until_idle())
    for request_id, delta in zip(request_ids, deltas, strict=True):
        assert turns[request_id].output_ids == reference_turn(loaded_model, [], delta, params)
    assert_pool_baseline(engine)


@pytest.mark.parametrize("spec", ["none", "suffix"])
def test_eviction_and_preemption_keep_outputs(loaded_model: LoadedModel, spec: str) -> None:
    # 20 pages of 16 tokens: four ~100-token prompts with 24 new tokens each cannot all fit.
    page_bytes = loaded_model.model.config.num_kv_values_per_token * 16 * 4
    engine = Engine(loaded_model, EngineConfig(page_size=16, kv_memory_bytes=20 * page_bytes,
                                               max_batch_tokens=128, check_invariants=True,
                                               spec=spec))
    driver = TurnDriver(engine)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    long_text = " ".join(USER_TEXTS[3:6])
    deltas = [user_delta(loaded_model, f"{i}: {long_text}", True) for i in range(4)]
    # Warm the cache with an unrelated prompt so admission has to evict it.
    driver.run(None, user_delta(loaded_model, USER_TEXTS[9], True), GREEDY)
    cached_before = engine.cache.num_cached_pages
    request_ids = [driver.submit(None, delta, params) for delta in deltas]
    seen_preemption = False
    outputs = []
    while engine.has_work:
        outputs.extend(engine.step())
        seen_preemption |= any(r.num_preemptions for r in engine.scheduler.running)
        seen_preemption |= any(r.num_preemptions for r in engine.scheduler.waiting)
    turns = driver.collect(outputs)
    assert cached_before > 0 and seen_preemption
    for request_id, delta in zip(request_ids, deltas, strict=True):
        assert turns[request_id].output_ids == reference_turn(loaded_model, [], delta, params)
    assert_pool_baseline(engine)
