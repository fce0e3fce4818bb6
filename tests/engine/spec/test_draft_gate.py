"""The draft gate: misses back drafting off exponentially, an accepted token resets it, and
the engine's greedy output is the same with the gate, without it and without drafting."""

from __future__ import annotations

from engine.models.loader import LoadedModel
from engine.sampling_params import SamplingParams
from engine.spec.gate import DraftGate, DraftGateConfig
from tests.engine.spec.test_spec_engine import (
    assert_pool_baseline,
    make_engine,
    repetitive_prompts,
    run,
)


def skipped_steps(gate: DraftGate, request_id: str) -> int:
    """How many steps `allow` refuses before it allows a lookup again."""
    num = 0
    while not gate.allow(request_id):
        num += 1
    return num


def test_misses_double_the_backoff_up_to_max_and_a_hit_resets_it() -> None:
    gate = DraftGate(DraftGateConfig(max_skip=8, patience=3))
    assert gate.allow("r")  # nothing observed yet: draft
    skips = []
    for _ in range(8):
        gate.observe("r", 4, 0)
        gate.check_invariants()
        skips.append(skipped_steps(gate, "r"))
    assert skips == [0, 0, 1, 2, 4, 8, 8, 8]  # two misses skip nothing (patience 3)
    gate.observe("r", 0, 0)  # an empty lookup is a miss too
    assert skipped_steps(gate, "r") == 8
    gate.observe("r", 4, 1)
    assert gate.allow("r")
    for _ in range(3):
        gate.observe("r", 4, 0)
    assert skipped_steps(gate, "r") == 1  # the backoff starts again after `patience` misses
    assert gate.num_skipped == 1 + 2 + 4 + 8 * 4 + 1
    gate.forget("r")
    gate.check_invariants()


def test_max_skip_zero_drafts_every_step() -> None:
    gate = DraftGate(DraftGateConfig(max_skip=0))
    for _ in range(5):
        gate.observe("r", 4, 0)
        assert gate.allow("r")
    assert gate.num_skipped == 0


def test_gate_keeps_greedy_output_and_skips_lookups_on_misses(tiny: LoadedModel) -> None:
    """A random model on fresh prompts: drafts from the prompt mostly miss, so the gate skips
    lookups; a retry in the same session copies the first try, so drafts are still accepted."""
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    prompts = repetitive_prompts(tiny)
    plain = run(make_engine(tiny, "none"), prompts, params)
    gated = make_engine(tiny, "suffix")
    ungated = make_engine(tiny, "suffix", draft_backoff=0)
    for engine in (gated, ungated):
        first = run(engine, prompts, params, session="s1")
        second = run(engine, prompts, params, session="s1")
        for rid, done in plain.items():
            assert first[rid].output_token_ids == done.output_token_ids, rid
            assert second[rid].output_token_ids == done.output_token_ids, rid
        assert sum(d.num_accepted for d in second.values()) > 0
        assert_pool_baseline(engine)
    assert gated.speculator is not None and ungated.speculator is not None
    assert gated.speculator.gate.num_skipped > 0
    assert ungated.speculator.gate.num_skipped == 0
    # Never more verified draft rows with the gate (here the misses are mostly empty lookups).
    assert gated.speculator.num_drafted <= ungated.speculator.num_drafted
