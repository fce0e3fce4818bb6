"""Free-running greedy output of a batch of prompts through the engine: what the precision
tests (mixed, packed) compare between two variants of one model."""

from __future__ import annotations

from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams


def greedy_outputs(loaded: LoadedModel, prompts: list[list[int]],
                   max_tokens: int = 32) -> list[list[int]]:
    """`max_tokens` greedy tokens for every prompt (EOS ignored), all prompts in one engine
    (decoded as one batch, no prefix cache), structures checked after."""
    engine = Engine(loaded, EngineConfig(enable_prefix_cache=False, kv_memory_bytes=256 << 20,
                                         check_invariants=True))
    for i, prompt in enumerate(prompts):
        engine.submit(Extend(f"r{i}", "t", None, prompt,
                             SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    done = {m.request_id: m.output_token_ids for m in engine.run_until_idle()
            if isinstance(m, Finished)}
    engine.check_invariants()
    return [done[f"r{i}"] for i in range(len(prompts))]
