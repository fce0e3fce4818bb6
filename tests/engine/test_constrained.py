"""Tool-call grammars in the engine: a random model's constrained output is always a valid call,
unconstrained rows of the same batch are untouched, and the grammar state supports the
mask / accept / rollback walk that draft verification needs."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from engine.constrained.spec import ToolConstraint, ToolSchema
from engine.constrained.xgrammar_backend import XGrammarBackend
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Failed, Finished, decode, encode
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer
from gateway.tool_prompt import normalize_tools, tool_constraint
from gateway.toolcall_parser import ToolCallParser
from tests.toolcall_tools import TOOLS, schema_of

PROMPT = "<|im_start|>user\nWhat now?<|im_end|>\n<|im_start|>assistant\n"


def constraint(choice: str | dict[str, str]) -> ToolConstraint:
    result = tool_constraint(normalize_tools(TOOLS), choice)
    assert result is not None
    return result


def engine_for(tiny: LoadedModel) -> Engine:
    torch.set_num_threads(1)
    return Engine(tiny, EngineConfig(kv_memory_bytes=64 << 20, check_invariants=True))


def finished_by_id(messages: list[object]) -> dict[str, Finished]:
    return {m.request_id: m for m in messages if isinstance(m, Finished)}


def check_calls(text: str, *, at_least: int, only: str | None = None,
                is_text_allowed: bool = False) -> None:
    parser = ToolCallParser()
    parser.feed(text)
    parser.finish()
    assert len(parser.tool_calls) >= at_least, text
    for call in parser.tool_calls:
        assert only is None or call.name == only
        jsonschema.validate(call.arguments, schema_of(call.name))
    if not is_text_allowed:  # "required" / named: nothing but calls
        assert parser.text == "", text


@pytest.mark.parametrize("choice", ["required", {"name": "create_event"}, {"name": "set_flags"}])
def test_random_model_always_emits_valid_calls(tiny: LoadedModel, real_tokenizer: Tokenizer,
                                               choice: str | dict[str, str]) -> None:
    engine = engine_for(tiny)
    prompt = real_tokenizer.encode(PROMPT)
    for i in range(6):
        temperature = 0.0 if i == 0 else 1.0
        engine.submit(Extend(f"r{i}", "ns", None, prompt,
                             SamplingParams(max_tokens=400, temperature=temperature, seed=i),
                             constraint=constraint(choice)))
    done = finished_by_id(engine.run_until_idle())
    assert len(done) == 6
    only = choice["name"] if isinstance(choice, dict) else None
    for fin in done.values():
        assert fin.finish_reason == "stop" and fin.stop_token_id is not None, fin.text
        check_calls(fin.text, at_least=1, only=only)


def test_without_parallel_calls_required_stops_after_one(tiny: LoadedModel,
                                                          real_tokenizer: Tokenizer) -> None:
    engine = engine_for(tiny)
    single = tool_constraint(normalize_tools(TOOLS), "required", enable_parallel_calls=False)
    assert single is not None and not single.enable_parallel_calls
    for i in range(4):
        engine.submit(Extend(f"r{i}", "ns", None, real_tokenizer.encode(PROMPT),
                             SamplingParams(max_tokens=400, temperature=1.0, seed=10 + i),
                             constraint=single))
    for fin in finished_by_id(engine.run_until_idle()).values():
        assert fin.finish_reason == "stop"
        assert fin.text.count("<tool_call>") == 1, fin.text
        check_calls(fin.text, at_least=1)


def test_unconstrained_rows_of_a_batch_are_untouched(tiny: LoadedModel,
                                                     real_tokenizer: Tokenizer) -> None:
    prompt = real_tokenizer.encode(PROMPT)
    plain = Extend("plain", "ns", None, prompt, SamplingParams(max_tokens=24, ignore_eos=True))
    alone = engine_for(tiny)
    alone.submit(plain)
    expected = finished_by_id(alone.run_until_idle())["plain"].output_token_ids
    mixed = engine_for(tiny)
    mixed.submit(Extend("tool", "ns", None, prompt, SamplingParams(max_tokens=400),
                        constraint=constraint("required")))
    mixed.submit(plain)
    done = finished_by_id(mixed.run_until_idle())
    assert done["plain"].output_token_ids == expected
    check_calls(done["tool"].text, at_least=1)


def test_auto_allows_text_then_forces_a_valid_call(real_tokenizer: Tokenizer) -> None:
    """Once `<tool_call>` opens inside free text, random logits masked by the grammar still
    produce a call that validates; then free text (or the end) may follow."""
    backend = XGrammarBackend(real_tokenizer, real_tokenizer.vocab_size)
    gen = torch.Generator().manual_seed(0)
    stop_ids = list(real_tokenizer.stop_token_ids)
    for trial in range(8):
        grammar = backend.new_grammar(constraint("auto"), stop_ids)
        text_ids = real_tokenizer.encode(f"Calling a tool ({trial}). <tool_call>")
        assert all(grammar.accept_token(t) for t in text_ids)
        out: list[int] = []
        while len(out) < 400:
            logits = torch.randn(1, real_tokenizer.vocab_size, generator=gen)
            backend.mask_logits(logits, [grammar])
            token = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=gen))
            assert grammar.accept_token(token)
            if token in stop_ids:
                break
            out.append(token)
            if real_tokenizer.decode(out).count("</tool_call>"):
                break
        check_calls(real_tokenizer.decode(text_ids + out), at_least=1, is_text_allowed=True)


def test_none_masks_out_the_tool_call_tag(real_tokenizer: Tokenizer) -> None:
    backend = XGrammarBackend(real_tokenizer, real_tokenizer.vocab_size)
    grammar = backend.new_grammar(constraint("none"), list(real_tokenizer.stop_token_ids))
    assert all(grammar.accept_token(t) for t in real_tokenizer.encode("I will not <tool_call"))
    close = real_tokenizer.encode(">")
    assert len(close) == 1 and not grammar.accept_token(close[0])
    logits = torch.zeros(1, real_tokenizer.vocab_size)
    backend.mask_logits(logits, [grammar])
    assert logits[0, close[0]] == float("-inf")
    assert logits[0, real_tokenizer.encode(" no")[0]] == 0.0  # other text still allowed


def test_mask_accept_rollback_walk(real_tokenizer: Tokenizer) -> None:
    """What draft verification does: mask per position, accept, and roll back rejected ones."""
    backend = XGrammarBackend(real_tokenizer, real_tokenizer.vocab_size)
    grammar = backend.new_grammar(constraint({"name": "get_weather"}),
                                  list(real_tokenizer.stop_token_ids))
    draft = real_tokenizer.encode('<tool_call>\n{"name": "get_weather", "arguments": '
                                  '{"city": "Oslo", "unit": "celsius"}}\n</tool_call>')
    masks = []
    for token in draft:
        bitmask = torch.zeros(1, -(-real_tokenizer.vocab_size // 32), dtype=torch.int32)
        grammar.fill_next_token_bitmask(bitmask, 0)
        masks.append(bitmask.clone())
        assert grammar.accept_token(token)
    assert grammar.num_accepted == len(draft)
    grammar.rollback(5)
    bitmask = torch.zeros_like(masks[0])
    grammar.fill_next_token_bitmask(bitmask, 0)
    assert torch.equal(bitmask, masks[len(draft) - 5])
    with pytest.raises(ValueError):
        grammar.rollback(grammar.num_accepted + 1)
    assert all(grammar.accept_token(t) for t in draft[-5:])  # the same path again
    assert not grammar.is_terminated
    assert grammar.accept_token(real_tokenizer.stop_token_ids[0]) and grammar.is_terminated


def test_extend_with_a_constraint_crosses_the_wire() -> None:
    extend = Extend("r", "ns", None, [1, 2], SamplingParams(max_tokens=3),
                    constraint=constraint({"name": "read_file"}))
    assert decode(encode(extend)) == extend
    plain = Extend("r", "ns", None, [1, 2])
    assert decode(encode(plain)) == plain


def test_bad_schemas_and_eos_less_requests_fail(tiny: LoadedModel,
                                                real_tokenizer: Tokenizer) -> None:
    engine = engine_for(tiny)
    bad = ToolConstraint((ToolSchema("t", json.dumps({
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(["}}})),),
        "required")
    prompt = real_tokenizer.encode(PROMPT)
    (failed,) = engine.submit(Extend("bad", "ns", None, prompt, constraint=bad))
    assert isinstance(failed, Failed) and failed.error_type == "invalid_tool_schema"
    (failed,) = engine.submit(Extend("eos", "ns", None, prompt,
                                     SamplingParams(ignore_eos=True),
                                     constraint=constraint("required")))
    assert isinstance(failed, Failed) and failed.error_type == "invalid_request"
