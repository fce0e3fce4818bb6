"""Greedy output in the machine's default dtype (mixed bf16 + fp32 where the CPU has bf16
instructions) does not depend on drafting or on what else shares a step: decode and
draft-verification rows always take the decode path (`ModelRunner._path_groups`), even when a
step holds more rows than the decode path takes by default (several requests' draft rows) or
a prefill chunk of another request.

Without that, a step of 3 requests with 8 drafts each (27 rows) ran every row on the bf16
extend weights, while plain decoding ran 3 rows on the GGUF codes, and greedy tokens flipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.workload import stdlib_source
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel, default_dtype, load_model
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams
from engine.spec.eagle3_checkpoint import random_eagle3_head, save_eagle3_head
from engine.spec.speculator import Speculator
from tests.engine.spec.test_tree_drafts import OracleTrees

pytestmark = pytest.mark.slow

PROMPTS = ("Write a short story about a robot learning to paint.",
           "Explain how a hash map works, step by step.",
           'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model(None, default_dtype("cpu"), show_progress=False)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory: pytest.TempPathFactory, model: LoadedModel) -> Path:
    folder = tmp_path_factory.mktemp("eagle3")
    save_eagle3_head(folder, random_eagle3_head(model.model.config, 2048, seed=0))
    return folder


def _engine(model: LoadedModel, spec: str, **config: int) -> Engine:
    return Engine(model, EngineConfig(spec=spec, check_invariants=True, max_batch_tokens=256,
                                      **config))


def _together(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.submit(Extend(f"r{i}", "ns", None, ids, params))
    done = {m.request_id: m for m in engine.run_until_idle() if isinstance(m, Finished)}
    return [done[f"r{i}"].output_token_ids for i in range(len(prompts))]


def test_drafting_keeps_greedy_output_with_many_draft_rows(model: LoadedModel,
                                                           head_dir: Path) -> None:
    """3 requests decode together; with 8 drafts each a verify step is 27 rows."""
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    plain = _together(_engine(model, "none"), prompts, 40)
    for spec in (f"eagle3:{head_dir}", "suffix"):
        engine = _engine(model, spec)
        assert _together(engine, prompts, 40) == plain, spec
        assert engine.stats().num_drafted > 0, spec
        engine.check_invariants()


def test_tree_verification_keeps_greedy_output(model: LoadedModel, head_dir: Path) -> None:
    """Trees whose right path runs through second branches (every accepted node's KV moves),
    and the head's own trees: the same tokens as plain decoding."""
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    plain = _together(_engine(model, "none"), prompts, 32)
    engine = _engine(model, "none")
    outputs = {tuple(ids): out for ids, out in zip(prompts, plain, strict=True)}
    engine.speculator = Speculator(OracleTrees(outputs, model.model.config.vocab_size, 4), 8)
    assert _together(engine, prompts, 32) == plain
    assert engine.stats().num_accepted > 0.4 * engine.stats().num_drafted
    engine = _engine(model, f"eagle3:{head_dir}", draft_topk=3, draft_steps=3)
    assert _together(engine, prompts, 32) == plain
    engine.check_invariants()


def test_a_prefill_beside_decodes_does_not_move_them(model: LoadedModel) -> None:
    """Request A decodes alone, then again while B's 700-token prompt is prefilled in chunks
    of 256 rows in the same steps: A's tokens are the same."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompt = model.tokenizer.encode(PROMPTS[1])
    long_ids = model.tokenizer.encode(stdlib_source("textwrap.py"))[:700]
    alone = _together(_engine(model, "none"), [prompt], 24)[0]
    engine = _engine(model, "none")
    engine.submit(Extend("a", "ns", None, prompt, params))
    messages = []
    for _ in range(3):  # A's prefill, then its first decodes
        messages.extend(engine.step())
    engine.submit(Extend("b", "ns", None, long_ids, SamplingParams(max_tokens=2)))
    messages.extend(engine.run_until_idle())
    done = {m.request_id: m for m in messages if isinstance(m, Finished)}
    assert done["a"].output_token_ids == alone
    engine.check_invariants()
