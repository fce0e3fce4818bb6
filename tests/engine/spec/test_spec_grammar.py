"""Draft verification under a tool-call grammar: each drafted row is masked by the grammar's state
after the draft so far, so greedy output equals plain constrained decoding token for token."""

from __future__ import annotations

import pytest

from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams
from gateway.tool_prompt import normalize_tools, tool_constraint
from tests.toolcall_tools import TOOLS

PROMPT = "<|im_start|>user\nWhat now?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("choice", ["required", {"name": "create_event"}])
def test_drafted_constrained_output_equals_plain(tiny: LoadedModel,
                                                 choice: str | dict[str, str]) -> None:
    constraint = tool_constraint(normalize_tools(TOOLS), choice)
    prompt = tiny.tokenizer.encode(PROMPT)
    outputs: dict[str, list[list[int]]] = {}
    engines = {}
    for spec in ("none", "suffix"):
        engine = engines[spec] = Engine(tiny, EngineConfig(kv_memory_bytes=64 << 20, spec=spec,
                                                           check_invariants=True))
        outputs[spec] = []
        # The second request of the session re-generates the first: its drafts come from the
        # session's corpus and run through the grammar.
        for i in range(2):
            engine.submit(Extend(f"r{i}", "ns", None, prompt, SamplingParams(max_tokens=48),
                                 session_id="s", constraint=constraint))
            (done,) = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
            outputs[spec].append(done.output_token_ids)
    assert outputs["suffix"] == outputs["none"]
    assert engines["suffix"].stats().num_accepted > 0
