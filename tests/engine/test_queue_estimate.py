"""The load shedder's estimate of a new request's wait for its first token: measured from the
engine's own steps, growing with the prefill queued ahead, zero on a cold engine."""

from __future__ import annotations

import pytest

from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend
from engine.sampling_params import SamplingParams
from engine.scheduler.queue_estimate import QueueEstimator, prefill_rows


def _prompt(n: int, start: int) -> list[int]:
    return [start + i % 500 for i in range(n)]


def test_estimator_arithmetic() -> None:
    est = QueueEstimator()
    assert est.wait_s([], [], 4, 100) == 0.0  # nothing measured: a cold engine admits
    est.record_step(200, 0.5)
    est.record_step(0, 0.3)  # a decode-only step says nothing of the prefill rate
    assert est.prefill_tokens_per_s == 400.0
    assert est.step_s == 0.9 * 0.5 + 0.1 * 0.3
    assert est.wait_s([], [], 4, 400) == 1.0 + 2 * est.step_s
    est.record_finish(10.0)
    est.record_finish(12.0)
    assert est.finish_interval_s == 2.0


def test_prefill_rows_counts_prompt_positions_only(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(kv_memory_bytes=16 << 20))
    engine.submit(Extend("a", "ns", None, _prompt(40, 100), SamplingParams(max_tokens=4)))
    req = engine.scheduler.waiting[0]
    assert prefill_rows(req, 0, 16) == 16
    assert prefill_rows(req, 32, 16) == 8  # positions 32..39 are prompt, 40.. are not
    assert prefill_rows(req, 40, 1) == 0


def test_engine_estimate_grows_with_the_queue_and_counts_cached_prefixes(
        tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(kv_memory_bytes=32 << 20, max_batch_tokens=64,
                                       max_running=2))
    assert engine.queue_wait_s(100) == 0.0
    engine.submit(Extend("warm", "ns", None, _prompt(128, 7), SamplingParams(max_tokens=2)))
    engine.run_until_idle()
    rate = engine.queue.prefill_tokens_per_s
    assert rate > 0
    idle = engine.queue_wait_s(100)
    assert idle == 100 / rate + 2 * engine.queue.step_s  # nothing ahead: its own prefill
    for i in range(4):
        engine.submit(Extend(f"q{i}", "ns", None, _prompt(200, 1000 * (i + 1)),
                             SamplingParams(max_tokens=8)))
    queued = engine.queue_wait_s(100)
    assert queued >= (800 + 100) / rate + 2 * engine.queue.step_s  # 4 prompts ahead, a slot
    engine.submit(Extend("hit", "ns", None, _prompt(128, 7) + [5, 6],
                         SamplingParams(max_tokens=2)))
    hit = engine.scheduler.waiting[-1]
    assert hit.queued_cached_len >= 112  # whole cached pages of the warm prompt
    engine.run_until_idle()
    engine.check_invariants()


def test_a_full_engine_adds_the_wait_for_a_running_slot(tiny: LoadedModel) -> None:
    """No finish measured yet: the slot wait comes from the running request's max_tokens."""
    engine = Engine(tiny, EngineConfig(kv_memory_bytes=16 << 20, max_running=1, spec="none"))
    engine.submit(Extend("long", "ns", None, _prompt(32, 9),
                         SamplingParams(max_tokens=40, ignore_eos=True)))
    for _ in range(3):
        engine.step()
    running = engine.scheduler.running[0]
    left = 40 - len(running.output_ids)
    alone = engine.queue.wait_s([], [], 1, 10)
    full = engine.queue_wait_s(10)
    assert full - alone == pytest.approx(left * engine.queue.step_s)
    engine.run_until_idle()
    engine.check_invariants()


def test_probes_that_admit_reserve_until_their_turn_arrives(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(kv_memory_bytes=16 << 20))
    engine.submit(Extend("warm", "ns", None, _prompt(64, 3), SamplingParams(max_tokens=2)))
    engine.run_until_idle()
    first = engine.queue_wait_s(200, reserve_for="turn-a", max_wait_s=60.0)
    second = engine.queue_wait_s(200, reserve_for="turn-b", max_wait_s=60.0)
    assert second > first  # turn-a's 200 tokens are ahead of turn-b
    refused = engine.queue_wait_s(200, reserve_for="turn-c", max_wait_s=second / 2)
    assert "turn-c" not in engine.queue.reserved  # over its bound: nothing reserved
    assert refused > second
    engine.submit(Extend("a", "ns", None, _prompt(200, 900), SamplingParams(max_tokens=2),
                         bind_turn_id="turn-a"))
    assert set(engine.queue.reserved) == {"turn-b"}  # turn-a arrived: now a waiting request
    engine.run_until_idle()
