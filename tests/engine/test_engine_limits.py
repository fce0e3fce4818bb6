"""Output limits and resumed requests on a tiny random model: max_tokens is clamped to the room
left in the context (finish "length"), and a request resumed from an earlier attempt's output
continues exactly as the uninterrupted one (greedy, stop strings, tool grammar)."""

from __future__ import annotations

import pytest

from engine.engine import Engine
from engine.errors import InvalidRequest
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Failed, Finished, Message, TokenChunk
from engine.sampling_params import SamplingParams
from tests.engine.test_engine_core import finished, make_engine, prompt


def _run(engine: Engine, extend: Extend) -> tuple[Finished, list[TokenChunk]]:
    assert engine.submit(extend) == []
    out: list[Message] = engine.run_until_idle()
    engine.check_invariants()
    return finished(out)[extend.request_id], [m for m in out if isinstance(m, TokenChunk)]


def test_max_tokens_is_clamped_to_the_room_left_in_the_context(tiny: LoadedModel) -> None:
    engine = make_engine(tiny, kv_memory_bytes=64 << 20)
    context_len = tiny.model.config.max_position_embeddings
    assert engine.kv_pool.layout.num_tokens >= context_len  # the context is the binding limit
    ids = prompt(context_len - 5)
    done, _ = _run(engine, Extend("r", "ns", None, ids, SamplingParams(max_tokens=32000,
                                                                       ignore_eos=True)))
    assert done.finish_reason == "length" and done.output_len == 5
    # Not even one token of room: a clean error, nothing queued.
    (failure,) = engine.submit(Extend("full", "ns", None, prompt(context_len),
                                      SamplingParams(max_tokens=1)))
    assert isinstance(failure, Failed) and failure.error_type == "request_too_long"
    assert not engine.has_work


def test_max_tokens_is_clamped_to_the_kv_pool(tiny: LoadedModel) -> None:
    engine = make_engine(tiny, kv_memory_bytes=1 << 20)
    pool_len = engine.kv_pool.layout.num_tokens
    assert pool_len < tiny.model.config.max_position_embeddings  # the pool binds here
    done, _ = _run(engine, Extend("r", "ns", None, prompt(pool_len - 3),
                                  SamplingParams(max_tokens=500, ignore_eos=True)))
    assert done.finish_reason == "length" and done.output_len == 3
    engine.reset_cache()
    assert engine.page_pool.num_free_pages == engine.page_pool.num_pages


@pytest.mark.parametrize("split", [1, 7, 19])
def test_resumed_request_continues_like_the_uninterrupted_one(tiny: LoadedModel,
                                                               split: int) -> None:
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    whole, chunks = _run(make_engine(tiny), Extend("a", "ns", None, prompt(30), params))
    text_before = "".join(c.text for c in chunks[:split])
    # A fresh engine (the restarted worker) resumes from the first `split` tokens.
    resumed, new_chunks = _run(make_engine(tiny), Extend(
        "b", "ns", None, prompt(30), params, resume_output_ids=whole.output_token_ids[:split]))
    assert resumed.output_token_ids == whole.output_token_ids
    assert resumed.text == whole.text and resumed.finish_reason == whole.finish_reason
    assert resumed.output_len == 20 and resumed.prompt_len == 30
    # Only the new tokens are sent, and their text completes what was sent before.
    assert [t for c in new_chunks for t in c.token_ids] == whole.output_token_ids[split:]
    assert text_before + "".join(c.text for c in new_chunks) == whole.text


def test_resume_keeps_stop_strings_held_across_the_split(tiny: LoadedModel) -> None:
    base = SamplingParams(max_tokens=24, ignore_eos=True)
    plain, _ = _run(make_engine(tiny), Extend("p", "ns", None, prompt(12), base))
    # A stop string made of the text of tokens 10..12: it spans any split in between.
    tok = tiny.tokenizer
    stop = tok.decode(plain.output_token_ids[10:13])
    assert stop and stop not in tok.decode(plain.output_token_ids[:12])
    params = SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,))
    whole, _ = _run(make_engine(tiny), Extend("a", "ns", None, prompt(12), params))
    assert whole.finish_reason == "stop"
    resumed, _ = _run(make_engine(tiny), Extend(
        "b", "ns", None, prompt(12), params, resume_output_ids=whole.output_token_ids[:11]))
    assert resumed.text == whole.text and resumed.finish_reason == "stop"


@pytest.mark.parametrize(("resume", "why"), [
    (lambda out: out + [0] * 20, "no room"),
    (lambda out: [10**9], "bad id"),
])
def test_impossible_resume_is_a_clean_error(tiny: LoadedModel, resume: object, why: str) -> None:
    engine = make_engine(tiny)
    ids = prompt(10)
    extend = Extend("r", "ns", None, ids, SamplingParams(max_tokens=4, ignore_eos=True),
                    resume_output_ids=resume([1, 2]))  # type: ignore[operator]
    (failure,) = engine.submit(extend)
    assert isinstance(failure, Failed) and failure.error_type == "invalid_request", why
    assert not engine.has_work and engine.page_pool.num_free_pages == engine.page_pool.num_pages


def test_max_context_limits_prompt_and_output(tiny: LoadedModel) -> None:
    """--max-context: a prompt that fills it is refused before any compute, naming both
    lengths; a shorter one's output stops at it; a value past the model's context is refused
    at start."""
    engine = make_engine(tiny, kv_memory_bytes=64 << 20, max_context=100)
    (failure,) = engine.submit(Extend("long", "ns", None, prompt(120), SamplingParams()))
    assert isinstance(failure, Failed) and failure.error_type == "request_too_long"
    assert "120" in failure.message and "100" in failure.message
    assert not engine.has_work
    done, _ = _run(engine, Extend("r", "ns", None, prompt(90), SamplingParams(max_tokens=50,
                                                                              ignore_eos=True)))
    assert done.finish_reason == "length" and done.output_len == 10
    model_len = tiny.model.config.max_position_embeddings
    with pytest.raises(InvalidRequest, match=str(model_len)):
        make_engine(tiny, max_context=model_len + 1)
