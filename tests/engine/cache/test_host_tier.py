"""The host KV tier: pages the radix cache evicts are kept in a second pool and loaded back on a
hit. Greedy output with the tier equals recompute, on a replay whose working set is many times
the device pool."""

from __future__ import annotations

from engine.cache.host_tier import page_keys
from engine.models.loader import LoadedModel
from engine.protocol import Extend
from engine.sampling_params import SamplingParams
from tests.engine.test_engine_core import finished, make_engine, prompt

PAGE_BYTES = 2048  # the tiny model's K+V of one 4-token page, fp32


def replay(loaded: LoadedModel, **config: object) -> tuple[list[list[int]], object]:
    """6 sessions x 4 turns, round robin, each turn the whole path so far plus new tokens."""
    engine = make_engine(loaded, kv_memory_bytes=40 * PAGE_BYTES, **config)
    paths = [prompt(40, 100 + 500 * s) for s in range(6)]
    outputs: list[list[int]] = []
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    for turn in range(4):
        for s, path in enumerate(paths):
            request_id = f"s{s}t{turn}"
            engine.submit(Extend(request_id, "ns", None, list(path), params))
            out = finished(engine.run_until_idle())[request_id].output_token_ids
            outputs.append(out)
            path.extend([*out, *prompt(12, 3000 + 100 * turn + s)])
    engine.check_invariants()
    return outputs, engine


def test_greedy_output_with_the_host_tier_equals_recompute(tiny: LoadedModel) -> None:
    with_tier, engine = replay(tiny, host_kv_memory_bytes=1024 * PAGE_BYTES)
    without, plain = replay(tiny)
    uncached, _ = replay(tiny, enable_prefix_cache=False)
    assert with_tier == without == uncached
    tier = engine.tiers.host  # type: ignore[attr-defined]
    assert tier.num_saved > 0 and tier.num_restored > 0
    stats, plain_stats = engine.stats(), plain.stats()  # type: ignore[attr-defined]
    assert stats.num_host_restored_pages == tier.num_restored
    assert stats.prefix_hit_tokens > plain_stats.prefix_hit_tokens  # loaded, not recomputed


def test_a_small_tier_drops_least_recently_used_pages_and_stays_consistent(
        tiny: LoadedModel) -> None:
    with_tier, engine = replay(tiny, host_kv_memory_bytes=24 * PAGE_BYTES)
    without, _ = replay(tiny)
    assert with_tier == without
    tier = engine.tiers.host  # type: ignore[attr-defined]
    assert tier.num_saved > tier.num_pages  # it wrapped around
    tier.check_invariants()


def test_page_keys_name_the_whole_prefix() -> None:
    a = page_keys("ns", [1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = page_keys("ns", [9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]  # same second page, other prefix
    assert page_keys("other", [1, 2, 3, 4], 4)[0] != a[0]
    assert page_keys("ns", [1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == a  # a partial page has no key
