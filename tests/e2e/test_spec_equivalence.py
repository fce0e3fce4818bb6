"""Drafting on == drafting off, token for token, greedy, on the real model: the agent-replay
workload (each turn generated with the trajectory so far as context) and 50 varied prompts."""

from __future__ import annotations

import uuid

import pytest

from benchmarks.workload import agent_trajectory
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

TOPICS = ["a lighthouse", "binary search", "JSON parsing", "a rainy day", "git rebase",
          "the Python GIL", "photosynthesis", "a chess opening", "TCP handshakes", "sourdough"]
FORMS = ["Explain {} in two sentences.", "Write a haiku about {}.",
         "List three facts about {} as JSON.", "Write a Python function related to {}.",
         "Repeat this phrase three times: {} is {}."]


def varied_prompts(loaded: LoadedModel) -> list[list[int]]:
    texts = [form.format(topic, topic) for form in FORMS for topic in TOPICS]
    assert len(texts) == 50
    return [loaded.tokenizer.encode(f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n")
            for t in texts]


def generate_all(engine: Engine, prompts: list[list[int]], max_tokens: int,
                 session: str | None = None) -> list[Finished]:
    ids = [uuid.uuid4().hex for _ in prompts]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.submit(Extend(rid, "ns", None, prompt, SamplingParams(max_tokens=max_tokens),
                             session_id=session))
    done = {m.request_id: m for m in engine.run_until_idle() if isinstance(m, Finished)}
    return [done[rid] for rid in ids]


def make_engines(loaded: LoadedModel) -> tuple[Engine, Engine]:
    # Invariants are checked after each test rather than every step: 50 sequences per step.
    return tuple(Engine(loaded, EngineConfig(kv_memory_bytes=256 << 20, spec=spec))
                 for spec in ("none", "suffix"))  # type: ignore[return-value]


def test_fifty_prompts_identical(loaded_model: LoadedModel) -> None:
    plain, spec = make_engines(loaded_model)
    prompts = varied_prompts(loaded_model)
    expected = generate_all(plain, prompts, 24)
    got = generate_all(spec, prompts, 24)
    for want, have in zip(expected, got, strict=True):
        assert have.output_token_ids == want.output_token_ids
    assert spec.stats().num_drafted > 0
    for engine in (plain, spec):
        engine.check_invariants()


def test_agent_replay_identical(loaded_model: LoadedModel) -> None:
    """Each turn's model reply (max 32 tokens) with the replay context so far; the spec engine
    also sees the session id, so it drafts from earlier turns."""
    plain, spec = make_engines(loaded_model)
    tok = loaded_model.tokenizer
    context: list[int] = []
    num_accepted = 0
    for turn in agent_trajectory(7):
        context += tok.encode(turn.text)
        (want,) = generate_all(plain, [context], 32)
        (have,) = generate_all(spec, [context], 32, session="replay")
        assert have.output_token_ids == want.output_token_ids
        num_accepted += have.num_accepted
    assert num_accepted > 0
    for engine in (plain, spec):
        engine.check_invariants()
        engine.reset_cache()
        assert engine.page_pool.num_free_pages == engine.page_pool.num_pages
