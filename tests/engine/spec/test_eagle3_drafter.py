"""The EAGLE-3 chain drafter: its incremental bookkeeping (features captured by the engine's own
forwards, the head extended over computed positions only, draft positions cut away) gives the
drafts a from-scratch computation gives; in the engine, greedy output is identical to drafting
off, with chunked prefills and prefix-cache hits, alone and with the suffix drafter taking long
matches (`eagle3+suffix`); `--spec eagle3:<dir>` loads or refuses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
import torch

from engine.attention.dense import DenseAttention
from engine.core import Request
from engine.errors import InvalidDraftHead
from engine.models.loader import LoadedModel
from engine.sampling_params import SamplingParams
from engine.scheduler.scheduler import ScheduledItem
from engine.spec.eagle3_checkpoint import random_eagle3_head, save_eagle3_head
from engine.spec.eagle3_drafter import Eagle3Drafter
from engine.spec.eagle3_head import Eagle3Head, load_eagle3_head
from engine.spec.factory import make_speculator
from engine.spec.hybrid_drafter import HybridDrafter
from tests.engine.spec.test_spec_engine import (
    assert_pool_baseline,
    make_engine,
    repetitive_prompts,
    run,
)

LAYERS = (0, 1)  # the tiny target has 2 layers: the embedding and layer 1's input


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory: pytest.TempPathFactory, tiny: LoadedModel) -> Path:
    folder = tmp_path_factory.mktemp("eagle3")
    save_eagle3_head(folder, random_eagle3_head(tiny.model.config, 512, seed=3, scale=0.2,
                                                captured_layer_ids=LAYERS))
    return folder


def _head(tiny: LoadedModel, head_dir: Path) -> Eagle3Head:
    return load_eagle3_head(head_dir, target_config=tiny.model.config,
                            target_embed=tiny.model.weights.embed, dtype=torch.float32)


@dataclass(eq=False)
class _Req:
    """What the drafter reads of a request."""

    request_id: str
    all_ids: list[int]
    num_computed: int = 0
    draft_ids: list[int] = field(default_factory=list)
    namespace: str = "ns"
    session_id: str | None = None

    @property
    def seq_len(self) -> int:
        return len(self.all_ids)


def _features(tiny: LoadedModel, ids: list[int]) -> torch.Tensor:
    n = len(ids)
    _, aux = tiny.model.forward_captured(torch.tensor(ids), torch.arange(n),
                                         DenseAttention([n]), LAYERS)
    assert aux is not None
    return aux


def _reference_drafts(head: Eagle3Head, aux: torch.Tensor, ids: list[int], k: int) -> list[int]:
    """The chain from scratch: the head over positions 0 .. n-2, then k greedy steps."""
    n = len(ids)
    kv = head.new_kv()
    out = head.forward(torch.tensor(ids[1:]), aux[: n - 1], torch.arange(n - 1), [kv], [n - 1])
    logits, hidden = out.logits[-1:], out.hidden[-1:]
    drafts: list[int] = []
    for step in range(k):
        token = head.top_k(logits, 1).token_ids[:, 0]
        drafts.append(int(token[0]))
        out = head.forward(token, hidden, torch.tensor([n - 1 + step]), [kv], [1])
        logits, hidden = out.logits, out.hidden
    return drafts


def test_incremental_drafts_equal_a_fresh_computation(tiny: LoadedModel, head_dir: Path) -> None:
    head = _head(tiny, head_dir)
    drafter = Eagle3Drafter(head, max_draft_len=4)
    ids = tiny.tokenizer.encode("alpha beta gamma delta epsilon zeta eta theta " * 4)[:30]
    req = _Req("r", list(ids))
    as_req = cast(Request, req)
    # A chunked prefill of positions 0..28 (29 and the sampled token are not computed yet).
    aux = _features(tiny, ids)
    drafter.record_features([ScheduledItem(as_req, 0, 12)], aux[:12])
    drafter.record_features([ScheduledItem(as_req, 12, 17)], aux[12:29])
    req.num_computed = 29
    [drafts] = drafter.propose([as_req], [4])
    assert drafts == _reference_drafts(head, aux, ids, 4)
    # Verification: two drafts accepted, then a correction; their positions were computed in
    # the verify forward (with the drafts, so the rows after the accepted ones are stale).
    verified = [*ids, drafts[0], drafts[1], 7]
    stale = _features(tiny, [*ids, *drafts])
    fresh = _features(tiny, verified)
    drafter.record_features([ScheduledItem(as_req, 29, 5, num_draft=4)], stale[29:34])
    req.all_ids, req.num_computed = verified, 32
    drafter.check_invariants()
    [again] = drafter.propose([as_req], [3])
    assert torch.allclose(stale[29:32], fresh[29:32])  # the accepted rows are the true ones
    assert again == _reference_drafts(head, fresh, verified, 3)
    drafter.finish(as_req)
    drafter.check_invariants()


def test_after_a_prefix_hit_the_head_starts_at_the_first_captured_position(
        tiny: LoadedModel, head_dir: Path) -> None:
    head = _head(tiny, head_dir)
    drafter = Eagle3Drafter(head, max_draft_len=3)
    ids = tiny.tokenizer.encode("one two three four five six seven eight nine ten " * 3)[:16]
    assert len(ids) == 16
    req = _Req("hit", list(ids), num_computed=15)
    aux = _features(tiny, ids)
    # Positions 0..11 came from the cache: only 12..14 were computed by this request.
    drafter.record_features([ScheduledItem(cast(Request, req), 12, 3)], aux[12:15])
    [drafts] = drafter.propose([cast(Request, req)], [3])
    kv = head.new_kv()
    out = head.forward(torch.tensor(ids[13:16]), aux[12:15], torch.arange(12, 15), [kv], [3])
    assert drafts[0] == int(head.top_k(out.logits[-1:], 1).token_ids[0, 0])
    assert len(drafts) == 3


@pytest.mark.parametrize("max_batch_tokens", [64, 5])
def test_eagle3_drafting_keeps_greedy_output(tiny: LoadedModel, head_dir: Path,
                                             max_batch_tokens: int) -> None:
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(tiny)
    plain = run(make_engine(tiny, "none", max_batch_tokens=max_batch_tokens), prompts, params)
    engine = make_engine(tiny, f"eagle3:{head_dir}", max_batch_tokens=max_batch_tokens)
    for _ in range(2):  # the second pass hits the prefix cache
        spec = run(engine, prompts, params)
        for rid, done in plain.items():
            assert spec[rid].output_token_ids == done.output_token_ids, rid
    assert engine.stats().num_drafted > 0
    assert_pool_baseline(engine)


def test_spec_setting_loads_or_refuses(tiny: LoadedModel, head_dir: Path,
                                       tmp_path: Path) -> None:
    speculator = make_speculator(f"eagle3:{head_dir}", 4, tiny)
    assert speculator is not None and speculator.capture_layers == LAYERS
    with pytest.raises(InvalidDraftHead):
        make_speculator(f"eagle3:{tmp_path / 'missing'}", 4, tiny)


def test_hybrid_takes_long_matches_from_the_suffix_drafter(tiny: LoadedModel,
                                                          head_dir: Path) -> None:
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(tiny)
    plain = run(make_engine(tiny, "none"), prompts, params)
    engine = make_engine(tiny, f"eagle3+suffix:{head_dir}")
    assert engine.speculator is not None
    drafter = cast(HybridDrafter, engine.speculator.drafter)
    for _ in range(2):  # the second pass re-emits the first one's output: long matches
        spec = run(engine, prompts, params, session="s1")
        for rid, done in plain.items():
            assert spec[rid].output_token_ids == done.output_token_ids, rid
    assert drafter.num_suffix_drafts > 0 and drafter.num_head_drafts > 0
    assert_pool_baseline(engine)


@pytest.mark.parametrize("diverge_at", [None, 20])
def test_next_turn_adopts_the_sessions_head_kv(tiny: LoadedModel, head_dir: Path,
                                              diverge_at: int | None) -> None:
    """Turn 2 hits the prefix cache on turn 1 (features only from position 16 on), yet drafts as
    if the head had read every position: it adopts turn 1's head KV up to the last position
    whose next token both turns share."""
    head = _head(tiny, head_dir)
    drafter = Eagle3Drafter(head, max_draft_len=3)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu "
    first_ids = tiny.tokenizer.encode(words * 4)[:30]
    first = _Req("t1", list(first_ids), session_id="s1")
    first_r = cast(Request, first)
    drafter.record_features([ScheduledItem(first_r, 0, 29)], _features(tiny, first_ids)[:29])
    first.num_computed = 29
    drafter.propose([first_r], [3])
    drafter.finish(first_r)
    assert len(drafter.kept) == 1

    second_ids = [*first_ids, *tiny.tokenizer.encode(" nu xi omicron pi rho sigma tau")[:10]]
    if diverge_at is not None:  # an edited earlier message: shared only up to there
        second_ids[diverge_at] = 42
    second = _Req("t2", second_ids, session_id="s1")
    second_r = cast(Request, second)
    aux = _features(tiny, second_ids)
    n = len(second_ids)
    drafter.record_features([ScheduledItem(second_r, 16, n - 1 - 16)], aux[16 : n - 1])
    second.num_computed = n - 1
    [drafts] = drafter.propose([second_r], [3])
    assert drafter._seqs["t2"].kv.num_tokens == n - 1  # every position, none recomputed here
    assert drafts == _reference_drafts(head, aux, second_ids, 3)
    drafter.check_invariants()


def test_a_missing_head_does_not_stop_the_suffix_drafter(tiny: LoadedModel,
                                                         head_dir: Path) -> None:
    """The head (random: it always misses) is gated by its own misses; the suffix drafter's
    long matches are still drafted on every step they exist, as by the suffix drafter alone,
    and a gated head is not run at all (its features wait)."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(tiny)
    alone = make_engine(tiny, "suffix")
    both = make_engine(tiny, f"eagle3+suffix:{head_dir}")
    assert both.speculator is not None
    drafter = cast(HybridDrafter, both.speculator.drafter)
    for _ in range(2):
        run(alone, prompts, params, session="s1")
        run(both, prompts, params, session="s1")
    assert drafter.head_gate.num_skipped > 0  # the head's misses gated it
    assert both.speculator.gate.num_skipped == 0  # ... and nothing else
    assert both.stats().num_accepted >= alone.stats().num_accepted
    both.check_invariants()


def test_a_head_that_does_not_pay_only_probes() -> None:
    from engine.spec.hybrid_drafter import HeadWorth

    worth = HeadWorth(min_accepted=1.0, probe_every=4, decay=0.5)
    assert worth.allow()  # a new head drafts
    for _ in range(6):
        worth.observe(0)
    assert [worth.allow() for _ in range(8)] == [False, False, False, True] * 2
    for _ in range(4):
        worth.observe(3)  # it started paying: drafts every time again
    assert all(worth.allow() for _ in range(5))


def test_an_idle_head_keeps_a_bounded_window_of_features(tiny: LoadedModel,
                                                         head_dir: Path) -> None:
    from engine.spec.eagle3_drafter import MAX_PENDING_FEATURES

    drafter = Eagle3Drafter(_head(tiny, head_dir), max_draft_len=2)
    ids = tiny.tokenizer.encode("lorem ipsum dolor sit amet consectetur " * 80)[:300]
    req = _Req("long", list(ids))
    aux = _features(tiny, ids)
    drafter.record_features([ScheduledItem(cast(Request, req), 0, 299)], aux[:299])
    assert len(drafter._seqs["long"].features) == MAX_PENDING_FEATURES
    req.num_computed = 299
    [drafts] = drafter.propose([cast(Request, req)], [2])
    assert len(drafts) == 2
    # The head started over at the oldest kept position: it read the last 256 only.
    assert drafter._seqs["long"].kv.num_tokens == MAX_PENDING_FEATURES
    drafter.check_invariants()
