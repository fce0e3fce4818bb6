"""Structured output in the engine: a constraint's text schema makes the output one JSON value
(alone, or as the alternative to tool calls under "auto"), a random model's constrained answer
always parses and validates, and the constraint crosses the wire."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar as xgr
from xgrammar import structural_tag as st
from xgrammar.testing import _is_grammar_accept_string

from engine.constrained.json_schema import bounded_strings_as_patterns, unsupported_feature
from engine.constrained.spec import ToolConstraint, ToolSchema, render_call
from engine.constrained.xgrammar_backend import structural_tag, text_schema_error
from engine.engine import Engine, EngineConfig
from engine.errors import InvalidRequest
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished, decode, encode
from engine.sampling_params import SamplingParams
from gateway.output_parser import parser_for
from gateway.response_format import schema_text
from gateway.tool_prompt import normalize_tools, tool_constraint
from tests.output_schemas import ORDER, PERSON, SCHEMAS
from tests.toolcall_tools import TOOLS, schema_of

PROMPT = "<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n"
CALL = render_call("get_weather", {"city": "Oslo", "unit": "celsius"})


def json_only(schema: dict[str, Any]) -> ToolConstraint:
    result = tool_constraint([], None, text_schema=schema_text(schema))
    assert result is not None and result.tools == () and result.mode == "none"
    return result


def with_tools(choice: str, schema: dict[str, Any]) -> ToolConstraint:
    result = tool_constraint(normalize_tools(TOOLS), choice, text_schema=schema_text(schema))
    assert result is not None
    return result


def accepts(constraint: ToolConstraint, text: str) -> bool:
    grammar = xgr.Grammar.from_structural_tag(structural_tag(constraint))
    return bool(_is_grammar_accept_string(grammar, text))


def test_schema_only_is_one_json_value_then_the_end() -> None:
    constraint = json_only(PERSON)
    assert isinstance(structural_tag(constraint).format, st.JSONSchemaFormat)
    good = '{"name": "Ada", "age": 36, "role": "admin"}'
    assert accepts(constraint, good) and accepts(constraint, good.replace(" ", ""))
    for bad in (good + "\n", " " + good, good + " ok", '{"name": "Ada", "age": 36}',
                '{"name": "Ada", "age": 36, "role": "root"}', CALL):
        assert not accepts(constraint, bad), bad


def test_auto_with_a_schema_is_the_json_answer_or_calls_only() -> None:
    constraint = with_tools("auto", PERSON)
    fmt = structural_tag(constraint).format
    assert isinstance(fmt, st.OrFormat)
    answer = '{"name": "Ada", "age": 36, "role": "user"}'
    assert accepts(constraint, answer)
    assert accepts(constraint, CALL) and accepts(constraint, CALL + "\n" + CALL)
    for bad in ("Sure. " + CALL, answer + "\n" + CALL, CALL + answer, "plain text", ""):
        assert not accepts(constraint, bad), bad
    single = tool_constraint(normalize_tools(TOOLS), "auto", enable_parallel_calls=False,
                             text_schema=schema_text(PERSON))
    assert single is not None and not accepts(single, CALL + "\n" + CALL)


def test_none_with_tools_and_a_schema_is_the_json_answer_only() -> None:
    constraint = with_tools("none", PERSON)
    assert accepts(constraint, '{"name": "A", "age": 1, "role": "guest"}')
    assert not accepts(constraint, CALL)


def test_required_and_named_take_no_schema() -> None:
    assert with_tools("required", PERSON).text_schema is None  # calls only, as without one
    named = tool_constraint(normalize_tools(TOOLS), {"name": "get_weather"})
    assert named is not None and named.text_schema is None
    tool = ToolSchema("t", "{}")
    with pytest.raises(InvalidRequest, match="no text schema"):
        ToolConstraint((tool,), "required", text_schema="{}")
    for bad in ("[1]", "not json", '"object"'):
        with pytest.raises(InvalidRequest):
            ToolConstraint((), "none", text_schema=bad)
    assert ToolConstraint((), "none", text_schema="true").text_schema_value is True


def test_constraint_round_trips_through_dict_and_wire() -> None:
    for constraint in (json_only(ORDER), with_tools("auto", PERSON), with_tools("none", ORDER)):
        assert ToolConstraint.from_dict(constraint.to_dict()) == constraint
        assert hash(ToolConstraint.from_dict(constraint.to_dict())) == hash(constraint)
        extend = Extend("r", "ns", None, [1, 2], SamplingParams(max_tokens=3),
                        constraint=constraint)
        assert decode(encode(extend)) == extend
    old = {k: v for k, v in with_tools("auto", PERSON).to_dict().items() if k != "text_schema"}
    assert ToolConstraint.from_dict(old).text_schema is None  # a peer without the field


def test_unsupported_features_are_named_with_their_place() -> None:
    assert unsupported_feature(ORDER) is None and unsupported_feature(True) is None
    cases = {
        "'not'": {"properties": {"a": {"not": {}}}},
        "'if'": {"if": {"required": ["a"]}, "then": {"required": ["b"]}},
        "'uniqueItems'": {"type": "array", "uniqueItems": True},
        "'multipleOf'": {"type": "number", "multipleOf": 0.5},
        "'allOf'": {"allOf": [{"type": "object"}, {"required": ["a"]}]},
        "'oneOf'": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        "https://x": {"$ref": "https://x/y.json"},
        "lookaround": {"type": "string", "pattern": "^(?!a)b$"},
        "'contains'": {"$defs": {"x/y": {"contains": {"type": "integer"}}}},
    }
    for word, schema in cases.items():
        problem = unsupported_feature(schema)
        assert problem is not None and word in problem, (word, problem)
    assert "#/$defs/x~1y" in (unsupported_feature(cases["'contains'"]) or "")
    assert "at #/properties/a" in (unsupported_feature(cases["'not'"]) or "")
    fine = [{"type": "array", "uniqueItems": False}, {"type": "integer", "multipleOf": 3},
            {"allOf": [{"type": "object"}]}, {"$ref": "#/$defs/a", "$defs": {"a": {}}},
            {"oneOf": [{"properties": {"k": {"const": "a"}}}], "discriminator": {}},
            {"properties": {"not": {"type": "string"}}},  # a property named like a keyword
            {"enum": [{"not": 1}]}]  # data, not a schema
    assert [unsupported_feature(s) for s in fine] == [None] * len(fine)


def test_compile_errors_and_bounded_strings() -> None:
    assert text_schema_error(ORDER) is None
    error = text_schema_error({"type": "string", "pattern": "^(a)\\1$"})
    assert error is not None and "Backreference" in error and not error.startswith("[")
    rewritten = bounded_strings_as_patterns({"type": "string", "maxLength": 3})
    assert rewritten == {"type": "string", "pattern": '^[^"\\\\\\x00-\\x1f]{0,3}$'}


def engine_for(tiny: LoadedModel, spec: str = "none") -> Engine:
    torch.set_num_threads(1)
    return Engine(tiny, EngineConfig(kv_memory_bytes=64 << 20, spec=spec,
                                     check_invariants=True))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_random_model_answers_always_validate(tiny: LoadedModel, name: str) -> None:
    engine = engine_for(tiny)
    prompt = tiny.tokenizer.encode(PROMPT)
    for i in range(4):
        engine.submit(Extend(f"r{i}", "ns", None, prompt,
                             SamplingParams(max_tokens=300, temperature=0.0 if i == 0 else 1.0,
                                            seed=i), constraint=json_only(SCHEMAS[name])))
    done = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
    assert len(done) == 4
    for fin in done:
        assert fin.finish_reason == "stop" and fin.stop_token_id is not None, fin.text
        jsonschema.validate(json.loads(fin.text), SCHEMAS[name])


def test_random_model_under_auto_gives_an_answer_or_valid_calls(tiny: LoadedModel) -> None:
    engine = engine_for(tiny)
    prompt = tiny.tokenizer.encode(PROMPT)
    constraint = with_tools("auto", PERSON)
    for i in range(6):
        engine.submit(Extend(f"r{i}", "ns", None, prompt,
                             SamplingParams(max_tokens=400, temperature=1.0, seed=20 + i),
                             constraint=constraint))
    kinds = set()
    for fin in (m for m in engine.run_until_idle() if isinstance(m, Finished)):
        assert fin.finish_reason == "stop", fin.text
        parser = parser_for(constraint)
        assert parser is not None
        parser.feed(fin.text)
        parser.finish()
        if parser.tool_calls:
            kinds.add("calls")
            assert parser.text == "", fin.text
            for call in parser.tool_calls:
                jsonschema.validate(call.arguments, schema_of(call.name))
        else:
            kinds.add("answer")
            jsonschema.validate(json.loads(parser.text), PERSON)
            assert parser.text == fin.text
    assert kinds == {"calls", "answer"}  # these seeds take both branches of the grammar


def test_drafted_json_output_equals_plain(tiny: LoadedModel) -> None:
    """Suffix drafting under a JSON schema: the second request re-generates the first, so its
    drafts come from the session's corpus and run through the grammar; greedy output is the
    same token for token, and drafts were accepted."""
    prompt = tiny.tokenizer.encode(PROMPT)
    outputs: dict[str, list[list[int]]] = {}
    engines = {}
    for spec in ("none", "suffix"):
        engine = engines[spec] = engine_for(tiny, spec)
        outputs[spec] = []
        for i in range(2):
            engine.submit(Extend(f"r{i}", "ns", None, prompt, SamplingParams(max_tokens=120),
                                 session_id="s", constraint=json_only(ORDER)))
            (done,) = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
            outputs[spec].append(done.output_token_ids)
            jsonschema.validate(json.loads(done.text), ORDER)
    assert outputs["suffix"] == outputs["none"]
    assert engines["suffix"].stats().num_accepted > 0
