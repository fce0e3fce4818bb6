"""Tree drafts in the engine: verified in one forward under a tree attention mask, the accepted
path's KV moved into place, greedy output identical to plain decoding; the EAGLE-3 head's trees
(`engine.spec.eagle3_tree`) are well formed and leave its KV as they found it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import torch

from engine.core import Request
from engine.engine import Engine
from engine.errors import InvalidRequest
from engine.models.loader import LoadedModel
from engine.sampling_params import SamplingParams
from engine.spec.drafter import DraftTree
from engine.spec.eagle3_checkpoint import random_eagle3_head, save_eagle3_head
from engine.spec.eagle3_drafter import Eagle3Drafter
from engine.spec.eagle3_head import load_eagle3_head
from engine.spec.eagle3_tree import TreeShape, TreeStart, draft_trees
from engine.spec.speculator import Speculator
from tests.engine.spec.test_spec_engine import (
    assert_pool_baseline,
    make_engine,
    repetitive_prompts,
    run,
)

LAYERS = (0, 1)


class OracleTrees:
    """Knows each request's plain greedy output: proposes a tree whose right path is never the
    first branch (so accepted nodes sit on later rows and their KV must move), with a wrong
    sibling before each right node."""

    name = "oracle"
    draws_trees = True

    def __init__(self, outputs: dict[tuple[int, ...], list[int]], vocab_size: int,
                 depth: int) -> None:
        self.outputs = outputs
        self.vocab_size = vocab_size
        self.depth = depth

    def propose_trees(self, requests: list[Request], max_lens: list[int]
                      ) -> list[DraftTree | list[int]]:
        return [self._tree(req, room) for req, room in zip(requests, max_lens, strict=True)]

    def propose(self, requests: list[Request], max_lens: list[int]) -> list[list[int]]:
        raise AssertionError("the engine asks a tree drafter for trees")

    def _tree(self, req: Request, room: int) -> DraftTree:
        output = self.outputs[tuple(req.prompt_ids)]
        right = output[len(req.output_ids):][: self.depth]
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1
        for token in right:
            if len(tokens) + 2 > room:
                break
            tokens += [(token + 1) % self.vocab_size, token]  # a wrong sibling, then the right
            parents += [parent, parent]
            parent = len(tokens) - 1
        return DraftTree(tokens, parents)

    def observe(self, request: Request, num_drafted: int, num_accepted: int) -> None:
        pass

    def finish(self, request: Request) -> None:
        pass

    def check_invariants(self) -> None:
        pass


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory: pytest.TempPathFactory, tiny: LoadedModel) -> Path:
    folder = tmp_path_factory.mktemp("eagle3")
    save_eagle3_head(folder, random_eagle3_head(tiny.model.config, 512, seed=5, scale=0.2,
                                                captured_layer_ids=LAYERS))
    return folder


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("max_batch_tokens", [64, 9])
def test_accepted_tree_paths_keep_greedy_output(tiny: LoadedModel, backend: str,
                                                max_batch_tokens: int) -> None:
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(tiny)
    plain = run(make_engine(tiny, "none", attention_backend=backend), prompts, params)
    outputs = {tuple(ids): plain[f"r{i}"].output_token_ids for i, ids in enumerate(prompts)}
    engine = make_engine(tiny, "none", attention_backend=backend,
                         max_batch_tokens=max_batch_tokens)
    engine.speculator = Speculator(OracleTrees(outputs, tiny.model.config.vocab_size, 4), 8)
    spec = run(engine, prompts, params)
    for rid, done in plain.items():
        assert spec[rid].output_token_ids == done.output_token_ids, rid
    stats = engine.stats()
    # Every right node is accepted (half the nodes), each after a rejected sibling.
    assert stats.num_accepted > 0.4 * stats.num_drafted > 0
    assert_pool_baseline(engine)


def test_eagle3_tree_drafts_keep_greedy_output(tiny: LoadedModel, head_dir: Path) -> None:
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = repetitive_prompts(tiny)
    plain = run(make_engine(tiny, "none"), prompts, params)
    for spec_mode in (f"eagle3:{head_dir}", f"eagle3+suffix:{head_dir}"):
        engine = make_engine(tiny, spec_mode, draft_topk=3, draft_steps=3, max_draft_len=8)
        assert engine.speculator is not None and engine.speculator.draws_trees
        for _ in range(2):  # the second pass hits the prefix cache
            spec = run(engine, prompts, params, session="s")
            for rid, done in plain.items():
                assert spec[rid].output_token_ids == done.output_token_ids, (spec_mode, rid)
        assert engine.stats().num_drafted > 0
        assert_pool_baseline(engine)


def test_head_trees_are_well_formed_and_leave_the_kv(tiny: LoadedModel, head_dir: Path) -> None:
    head = load_eagle3_head(head_dir, target_config=tiny.model.config,
                            target_embed=tiny.model.weights.embed, dtype=torch.float32)
    kvs = [head.new_kv() for _ in range(2)]
    starts = []
    for i, kv in enumerate(kvs):
        n = 6 + i
        gen = torch.Generator().manual_seed(i)
        out = head.forward(torch.randint(0, 100, (n,), generator=gen),
                           torch.randn(n, head.config.fused_size, generator=gen),
                           torch.arange(n), [kv], [n])
        starts.append(TreeStart(out.logits[-1], out.hidden[-1], kv, n + 1))
    trees = draft_trees(head, starts, [8, 5], TreeShape(topk=3, steps=4))
    for tree, kv, room, n in zip(trees, kvs, [8, 5], [6, 7], strict=True):
        assert kv.num_tokens == n  # draft rows cut away
        assert 0 < len(tree.token_ids) <= room
        assert all(-1 <= p < i for i, p in enumerate(tree.parents))
        assert tree.parents.count(-1) <= 3
    # topk 1 is the chain the drafter proposes.
    chain = draft_trees(head, starts[:1], [4], TreeShape(topk=1, steps=4))[0]
    assert chain.parents == [-1, 0, 1, 2]
    drafter = Eagle3Drafter(head, 4, tree=TreeShape(1, 4))
    assert not drafter.draws_trees


def test_tree_settings_are_checked(tiny: LoadedModel, head_dir: Path) -> None:
    with pytest.raises(InvalidRequest, match="draft-topk"):
        make_engine(tiny, "suffix", draft_topk=2)
    with pytest.raises(InvalidRequest, match="draft_topk"):
        make_engine(tiny, f"eagle3:{head_dir}", draft_topk=0)
    with pytest.raises(InvalidRequest, match="at most 62"):
        make_engine(tiny, f"eagle3:{head_dir}", draft_topk=2, max_draft_len=70)


def test_request_state_is_clean_after_a_tree_step(tiny: LoadedModel, head_dir: Path) -> None:
    engine = make_engine(tiny, f"eagle3:{head_dir}", draft_topk=2, draft_steps=2)
    prompt = repetitive_prompts(tiny)[0]
    from engine.protocol import Extend

    engine.submit(Extend("r", "ns", None, prompt, SamplingParams(max_tokens=6, ignore_eos=True)))
    while engine.has_work:
        engine.step()
        for req in engine.scheduler.running:
            assert cast(Request, req).draft_ids == [] and req.draft_parents is None
    assert_pool_baseline(engine)


def _recorded_drafts(engine: Engine) -> list[list[int]]:
    """Wrap the engine's drafter so every proposal is kept, in order."""
    assert engine.speculator is not None
    drafter = cast(Any, engine.speculator.drafter)
    seen: list[list[int]] = []
    propose = drafter.propose_trees

    def recording(requests: list[Request], max_lens: list[int]) -> list[DraftTree | list[int]]:
        out = propose(requests, max_lens)
        seen.extend(list(d.token_ids) if isinstance(d, DraftTree) else list(d) for d in out)
        return out

    drafter.propose_trees = recording
    return seen


def test_a_cache_hit_drafts_as_a_cold_turn_does(tiny: LoadedModel, tmp_path: Path) -> None:
    """Turn 2 of a session hits the prefix cache on turn 1; the head adopts turn 1's KV. Its
    drafts, step by step, are those of a cold engine that computed every position of turn 2
    itself, so acceptance after a hit is acceptance without one."""
    from engine.protocol import Extend, Finished

    # Large attention weights: drafts that depend on the context, so a head that missed the
    # cached positions would draft differently.
    head_dir = tmp_path / "head"
    save_eagle3_head(head_dir, random_eagle3_head(tiny.model.config, 512, seed=7, scale=1.5,
                                                  captured_layer_ids=LAYERS))
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    first = repetitive_prompts(tiny)[1]
    warm = make_engine(tiny, f"eagle3:{head_dir}", max_draft_len=3)
    warm.submit(Extend("t1", "ns", None, first, params, session_id="s"))
    reply = next(m for m in warm.run_until_idle() if isinstance(m, Finished)).output_token_ids
    second = [*first, *reply, *tiny.tokenizer.encode(" and then one more line")]
    seen_warm = _recorded_drafts(warm)
    warm.submit(Extend("t2", "ns", None, second, params, session_id="s"))
    hit = next(m for m in warm.run_until_idle() if isinstance(m, Finished))
    assert hit.cached_len > 0
    cold = make_engine(tiny, f"eagle3:{head_dir}", max_draft_len=3, enable_prefix_cache=False)
    seen_cold = _recorded_drafts(cold)
    cold.submit(Extend("t2", "ns", None, second, params, session_id="s"))
    fresh = next(m for m in cold.run_until_idle() if isinstance(m, Finished))
    assert fresh.cached_len == 0
    assert hit.output_token_ids == fresh.output_token_ids
    assert seen_warm and seen_warm == seen_cold
    assert (hit.num_drafted, hit.num_accepted) == (fresh.num_drafted, fresh.num_accepted)
