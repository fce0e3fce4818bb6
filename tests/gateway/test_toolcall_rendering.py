"""Tools in the prompt (Hermes/Qwen style): system block, calls and results written back, delta
rendering turn by turn equal to rendering the whole conversation, schema checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.constrained.spec import ToolConstraint, ToolSchema
from engine.tokenizer import Tokenizer
from gateway.errors import InvalidRequest, InvalidToolSchema
from gateway.rendering import TurnRenderer
from gateway.tool_prompt import (
    normalize_tools,
    template_messages,
    tool_constraint,
    tools_system_content,
)
from gateway.toolcall_parser import ToolCallParser

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}
SEARCH = {"name": "search", "description": "Web search",
          "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}

CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and news?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
        {"id": "call_2", "name": "search", "arguments": {"q": "news"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "calm"}]},
    {"role": "assistant", "content": "It is 21 degrees and calm."},
    {"role": "user", "content": "And Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [  # OpenAI's shape
        {"id": "call_3", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "call_3", "content": "18"},
]


def test_system_prompt_lists_tools_in_both_shapes(tokenizer: Tokenizer) -> None:
    tools = normalize_tools([WEATHER, SEARCH])
    assert [t.name for t in tools] == ["get_weather", "search"]
    assert tools[1].parameters == SEARCH["input_schema"]
    text = TurnRenderer(tokenizer).system_text("Be brief.", tools)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    block = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line)["function"]["name"] for line in block.split("\n")] == [
        "get_weather", "search"]
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n' in text
    assert text.endswith("</tool_call><|im_end|>\n")


def test_calls_and_results_are_written_as_hermes_markup() -> None:
    call, result = template_messages(CONVERSATION[1:3])
    assert call == {"role": "assistant", "content": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"q": '
        '"news"}}\n</tool_call>')}
    assert result == {"role": "tool", "content": '<tool_response>\n{"temp": 21}\n</tool_response>'}
    # The parser reads the markup back into the same text and calls.
    parser = ToolCallParser()
    parser.feed(call["content"])
    parser.finish()
    assert parser.text == "Let me check."
    assert [(c.name, c.arguments) for c in parser.tool_calls] == [
        (c["name"], c["arguments"]) for c in CONVERSATION[1]["tool_calls"]]


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_turn_by_turn_rendering_equals_the_whole_render(tokenizer: Tokenizer,
                                                        system: str | None) -> None:
    """The ledger (root, input deltas, generated assistant ids) decodes to exactly what the
    template renders for the whole conversation."""
    renderer = TurnRenderer(tokenizer)
    tools = normalize_tools([WEATHER, SEARCH])
    end_id = tokenizer.special_tokens["<|im_end|>"]
    ledger = renderer.system_token_ids(system, tools)
    after_root, closer, pending = True, "", []
    for message in [*CONVERSATION, {"role": "assistant", "content": "Rome: 18."}]:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        ledger += renderer.input_token_ids(pending, system=system, after_root=after_root,
                                           closer=closer, tools=tools)
        after_root, pending = False, []
        # What the model generates: the content with its calls as markup, then <|im_end|>.
        (generated,) = template_messages([message])
        output_ids = [*tokenizer.encode(generated["content"]), end_id]
        ledger += output_ids
        closer = renderer.closer(message["content"] or "", output_ids)
    system_msg = [{"role": "system", "content": tools_system_content(system, tools)}]
    full = renderer.template.render(system_msg + template_messages(CONVERSATION)
                                    + [{"role": "assistant", "content": "Rome: 18."}])
    assert tokenizer.decode(ledger) + "\n" == full


def test_invalid_schemas_are_rejected() -> None:
    def tool(params: Any) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "t", "parameters": params}}

    for params in ({"type": "object", "properties": {"a": {"type": "strang"}}},
                   {"type": "array"}, {"type": "object", "required": "a"}):
        with pytest.raises(InvalidToolSchema):
            normalize_tools([tool(params)])
    with pytest.raises(InvalidToolSchema, match="unique"):
        normalize_tools([WEATHER, WEATHER])
    assert normalize_tools([tool(None)])[0].parameters == {"type": "object"}


def test_tool_choice_becomes_the_engine_constraint() -> None:
    tools = normalize_tools([WEATHER, SEARCH])
    specs = tuple(ToolSchema(t.name, json.dumps(t.parameters)) for t in tools)
    assert tool_constraint(tools, None) == ToolConstraint(specs, "auto")
    assert tool_constraint(tools, "required") == ToolConstraint(specs, "required")
    assert tool_constraint(tools, "none") == ToolConstraint(specs, "none")
    assert tool_constraint(tools, {"name": "search"}) == ToolConstraint(specs, "named", "search")
    assert tool_constraint([], None) is None and tool_constraint([], "none") is None
    with pytest.raises(InvalidRequest):
        tool_constraint(tools, {"name": "nope"})
    with pytest.raises(InvalidRequest):
        tool_constraint([], "required")
    constraint = tool_constraint(tools, {"name": "search"})
    assert constraint is not None
    assert ToolConstraint.from_dict(constraint.to_dict()) == constraint
