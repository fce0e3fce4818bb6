"""What the family tests run: the paged forwards a step at a time, the engine's greedy output,
and the prompts; shared by the HF-folder and GGUF checks against transformers."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path

import torch

from engine.attention.base import PagedAttentionBackend, PagedBatch
from engine.engine import Engine, EngineConfig
from engine.kv_pool import KVLayout, KVPool
from engine.models.base import Model
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

PAGE_SIZE = 4
SHARED = 28  # tokens the second prompt shares with the first: 7 pages, past the 8-token window


def prompts(tokenizer_encode: Callable[[str], list[int]]) -> tuple[list[int], list[int]]:
    first = tokenizer_encode(inspect.getsource(json.dumps))[:48]
    other = tokenizer_encode(inspect.getsource(json.loads))[:20]
    assert len(first) == 48 and len(other) == 20
    return first, first[:SHARED] + other


def hf_model(folder: Path, **kwargs: object) -> torch.nn.Module:
    """transformers' model of an HF folder (or, with gguf_file=..., of a GGUF in it), fp32, with
    the eager attention that gpt-oss's sinks need."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager", **kwargs)
    model.eval()
    return model


def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


class PagedRun:
    """Forwards of one model over one KV pool, a step at a time, as the engine's runner does."""

    def __init__(self, model: Model, backend: type[PagedAttentionBackend]) -> None:
        self.model, self.backend = model, backend
        self.pool = KVPool(model.config, KVLayout(64, PAGE_SIZE, 0), model.kv_dtype)

    def step(self, ids: list[int], start: int, table: torch.Tensor) -> torch.Tensor:
        """Logits of rows [start, start + len(ids)) of the sequence whose pages are `table`."""
        positions = torch.arange(start, start + len(ids))
        slots = table[positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE
        batch = PagedBatch([len(ids)], [start + len(ids)], slots, [table])
        hidden = self.model.forward(torch.tensor(ids), positions, self.backend(self.pool, batch))
        return self.model.logits(hidden)


def paged_logits(model: Model, backend: type[PagedAttentionBackend], first: list[int],
                 second: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(every position's logits of `first`: chunks of 24 and 16 rows then 8 decodes; the
    logits of `second`'s rows past the SHARED tokens it takes from `first`'s pages)."""
    run = PagedRun(model, backend)
    table = torch.arange(12)
    rows = [run.step(first[:24], 0, table), run.step(first[24:40], 24, table)]
    rows += [run.step([token], 40 + i, table) for i, token in enumerate(first[40:])]
    shared_pages = SHARED // PAGE_SIZE
    second_table = torch.cat([table[:shared_pages], torch.arange(12, 12 + 12 - shared_pages)])
    return torch.cat(rows), run.step(second[SHARED:], SHARED, second_table)


def backends() -> list[str]:
    from engine.attention.cpu_paged import kernel

    return ["torch", "torch_sdpa"] + (["cpu"] if kernel() is not None else [])


def engine_greedy(loaded: LoadedModel, prompts: list[list[int]], *,
                  swa_memory: bool = True) -> list[Finished]:
    """32 greedy tokens per prompt, one after the other (so a later prompt finds an earlier
    one's prefix), prefills chunked at 16 tokens a step."""
    engine = Engine(loaded, EngineConfig(page_size=PAGE_SIZE, max_batch_tokens=16,
                                         kv_memory_bytes=16 << 20, check_invariants=True,
                                         swa_memory=swa_memory))
    results = []
    for i, ids in enumerate(prompts):
        engine.submit(Extend(f"r{i}", "t", None, ids, SamplingParams(max_tokens=32,
                                                                      ignore_eos=True)))
        (done,) = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
        results.append(done)
    engine.check_invariants()
    return results


def engine_turns(loaded: LoadedModel, first: list[int], tail: list[int], *,
                 swa_memory: bool = True) -> tuple[list[Finished], list[int]]:
    """Two agent turns: `first`, then `first` + its output + `tail` (whose prefix hit reaches
    past the first turn's window). Returns both results and the second prompt."""
    engine = Engine(loaded, EngineConfig(page_size=PAGE_SIZE, max_batch_tokens=16,
                                         kv_memory_bytes=16 << 20, check_invariants=True,
                                         swa_memory=swa_memory))
    results: list[Finished] = []
    prompt = first
    for i in range(2):
        engine.submit(Extend(f"r{i}", "t", None, prompt, SamplingParams(max_tokens=32,
                                                                         ignore_eos=True)))
        (done,) = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
        results.append(done)
        if i == 0:
            prompt = [*first, *done.output_token_ids, *tail]
    engine.check_invariants()
    return results, prompt


def hf_generate(hf: torch.nn.Module, ids: list[int], max_new_tokens: int = 32) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


def max_logit_diff(model: Model, backend: str, hf: torch.nn.Module, first: list[int],
                   second: list[int]) -> float:
    """Largest |ours - transformers| over `paged_logits`'s rows, through `backend`."""
    from engine.attention.registry import get_backend

    got_first, got_second = paged_logits(model, get_backend(backend), first, second)
    return max((got_first - hf_logits(hf, first)).abs().max().item(),
               (got_second - hf_logits(hf, second)[SHARED:]).abs().max().item())
