"""The timed cells of benchmarks.model_speed: shapes per model, prompt windows every engine is
fed alike, and one measurement per (engine, cell) for a radixgate variant or a peer.

- Prefill: cold TTFT of one prompt; radixgate's prefill engine has its prefix cache off, and a
  peer gets a prompt whose first token starts no earlier prompt, so neither llama.cpp's
  common-prefix reuse nor OpenVINO's block prefix cache can match it (llama.cpp's
  `last_cached_len` is recorded to show it). tokens/s = prompt tokens / TTFT.
- Decode: batch-1 greedy, EOS ignored, no drafting, rate = (tokens - 1) / (last token - first
  token), so the prompt's prefill stays out; the same prompt every repeat (each engine may take
  it from its cache: the KV read per step is the same).
- Batch 8 (radixgate only): 8 different prompts submitted together; aggregate rate = tokens
  generated after each request's first / (last finish - first first token).
"""

from __future__ import annotations

import inspect
import uuid
from dataclasses import dataclass
from typing import Any

from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

DECODE_TOKENS = 64
QUICK_DECODE_TOKENS = 32
BATCH = 8
WINDOW_STRIDE = 997  # tokens between the starts of successive prompt windows
CORPUS_MODULES = ("json", "difflib", "textwrap", "collections", "argparse", "typing", "inspect",
                  "dataclasses", "pathlib", "shlex")


@dataclass(frozen=True)
class Shapes:
    prefill: tuple[int, ...]  # cold prompt lengths
    long_context: int  # decode after a prompt of this many tokens
    long_label: str  # "4k" / "8k": the JSON key decode_<label>_tok_s
    decode_tokens: int


def shapes_for(context_len: int, quick: bool) -> Shapes:
    """An 8k-context model (SmolLM2): prefill 512 / 2048 / 8000, decode after 4000 tokens. A
    longer one (Qwen2.5-Coder, 32k): prefill 2048 / 8192, decode after 8192. Quick (a smoke
    check of the harness, any model): prefill 512 / 2048, decode after 2048, fewer tokens."""
    if quick:
        return Shapes((512, 2048), 2048, "2k", QUICK_DECODE_TOKENS)
    if context_len <= 8192:
        return Shapes((512, 2048, 8000), 4000, "4k", DECODE_TOKENS)
    return Shapes((2048, 8192), 8192, "8k", DECODE_TOKENS)


def corpus_ids(tokenizer: Any, num_tokens: int) -> list[int]:
    """Deterministic real text: standard-library sources, tokenised and cut to length (the
    first modules' tokens come first, so a short cut is the same for every length)."""
    import importlib

    text = ""
    for name in CORPUS_MODULES:
        text += inspect.getsource(importlib.import_module(name))
        if len(text) >= 3 * num_tokens:  # rarely fewer than 3 characters a token
            ids: list[int] = tokenizer.encode(text)
            if len(ids) >= num_tokens:
                return ids[:num_tokens]
    raise SystemExit(f"the prompt corpus is shorter than {num_tokens} tokens")


class Windows:
    """Prompt windows of one corpus, each starting `WINDOW_STRIDE` tokens after the last and
    on a token no earlier window started with."""

    def __init__(self, corpus: list[int]) -> None:
        self.corpus = corpus
        self.next = 0
        self.firsts: set[int] = set()

    def take(self, length: int) -> list[int]:
        start = self.next
        while start < len(self.corpus) and self.corpus[start] in self.firsts:
            start += 1
        if start + length > len(self.corpus):
            raise SystemExit(f"the prompt corpus has {len(self.corpus)} tokens, too few for "
                             "these shapes and repeats")
        self.firsts.add(self.corpus[start])
        self.next = start + WINDOW_STRIDE
        return self.corpus[start : start + length]


def run_one(engine: Engine, ids: list[int], max_tokens: int) -> Finished:
    engine.submit(Extend(uuid.uuid4().hex, "bench", None, ids,
                         SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    return next(m for m in engine.run_until_idle() if isinstance(m, Finished))


class RadixVariant:
    """One radixgate mode on its loaded model: a prefill engine (prefix cache off) and a decode
    engine (prefix cache on, so repeated decode prompts skip their prefill). No drafting: the
    peers' plain pipelines do not speculate either."""

    def __init__(self, name: str, loaded: LoadedModel, label: str, kv_bytes: int) -> None:
        self.name, self.loaded, self.label = name, loaded, label
        common: dict[str, Any] = {"kv_memory_bytes": kv_bytes, "max_batch_tokens": 2048,
                                  "spec": "none"}
        self.prefill_engine = Engine(loaded, EngineConfig(enable_prefix_cache=False, **common))
        self.decode_engine = Engine(loaded, EngineConfig(**common))
        self.last_cached_len: int | None = None

    @property
    def kv_itemsize(self) -> int:
        return self.decode_engine.kv_pool.k[0].element_size()

    def prefill_tok_s(self, ids: list[int]) -> float:
        f = run_one(self.prefill_engine, ids, 1)
        self.last_cached_len = f.cached_len
        return len(ids) / f.timings.ttft_s

    def decode_tok_s(self, ids: list[int], num_tokens: int) -> float:
        f = run_one(self.decode_engine, ids, num_tokens)
        return (f.output_len - 1) / f.timings.decode_s

    def batch_decode_tok_s(self, prompts: list[list[int]], num_tokens: int) -> float:
        engine = self.decode_engine
        for ids in prompts:
            engine.submit(Extend(uuid.uuid4().hex, "bench", None, ids,
                                 SamplingParams(max_tokens=num_tokens, ignore_eos=True)))
        done = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
        # Timings count from each request's arrival; all arrived within microseconds.
        first = min(f.timings.ttft_s for f in done)
        last = max(f.timings.ttft_s + f.timings.decode_s for f in done)
        return sum(f.output_len - 1 for f in done) / (last - first)


class PeerCells:
    """A peer with the same cells: prefill is its TTFT on a never-seen prompt."""

    def __init__(self, peer: Any) -> None:
        self.peer, self.name = peer, peer.name
        self.last_cached_len: int | None = None

    def prefill_tok_s(self, ids: list[int]) -> float:
        seconds: float = self.peer.ttft(ids)
        self.last_cached_len = self.peer.last_cached_len
        return len(ids) / seconds

    def decode_tok_s(self, ids: list[int], num_tokens: int) -> float:
        rate: float = self.peer.decode_tok_s(ids, num_tokens)
        return rate

