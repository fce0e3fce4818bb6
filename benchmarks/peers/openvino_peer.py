"""OpenVINO GenAI peer: paged KV, block prefix caching, chunked prefill, prompt lookup.

Loads the GGUF directly (`LLMPipeline(gguf_path, "CPU", ...)`). Prefix caching works on whole KV
blocks keyed by content, and the API has no call to clear it, so `reset_cache()` builds a fresh
pipeline (8-25 s on 2 cores: the GGUF is converted again; never counted in TTFT or `load_s`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.peers.base import check_num_tokens, check_prompt, timed_decode_tok_s

# Same values as performance.md §4b; max_num_batched_tokens is the chunked-prefill chunk.
CACHE_SIZE_GB = 2
MAX_NUM_BATCHED_TOKENS = 2048
NUM_ASSISTANT_TOKENS = 5
MAX_NGRAM_SIZE = 3


def _make_streamer(ov_genai: Any) -> Any:
    """A StreamerBase that timestamps each callback; it receives token ids, not text."""

    class _TimingStreamer(ov_genai.StreamerBase):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.t0 = time.perf_counter()
            self.times: list[float] = []
            self.counts: list[int] = []
            self.limit: int | None = None

        def write(self, token: int | list[int]) -> Any:
            num_new = 1 if isinstance(token, int) else len(token)
            self.times.append(time.perf_counter() - self.t0)
            self.counts.append((self.counts[-1] if self.counts else 0) + num_new)
            if self.limit is not None and self.counts[-1] >= self.limit:
                return ov_genai.StreamingStatus.STOP
            return ov_genai.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    return _TimingStreamer()


class OpenVINOPeer:
    """OpenVINO GenAI `LLMPipeline` with continuous batching and prefix caching on CPU.

    `prompt_lookup=True` builds the prompt-lookup (n-gram from the prompt) speculative pipeline; its
    `decode_tok_s` then drafts `num_assistant_tokens` tokens from n-grams up to `max_ngram_size`.
    """

    def __init__(
        self,
        gguf_path: str | Path,
        threads: int = 2,
        *,
        prompt_lookup: bool = False,
        num_assistant_tokens: int = NUM_ASSISTANT_TOKENS,
        max_ngram_size: int = MAX_NGRAM_SIZE,
    ) -> None:
        # Optional dependency: imported here so that importing this module never fails.
        import openvino as ov
        import openvino_genai as ov_genai

        self._ov = ov
        self._ov_genai = ov_genai
        self._gguf_path = str(gguf_path)
        self._threads = threads
        self._prompt_lookup = prompt_lookup
        self._num_assistant_tokens = num_assistant_tokens
        self._max_ngram_size = max_ngram_size
        self.name = "openvino-genai+pld" if prompt_lookup else "openvino-genai"
        self.last_cached_len: int | None = None
        self.last_num_prompt_tokens: int | None = None
        start = time.perf_counter()
        self._pipe: Any = self._build_pipeline()
        self.load_s = time.perf_counter() - start
        self._eos_token_id = int(self._pipe.get_generation_config().eos_token_id)

    def _build_pipeline(self) -> Any:
        scheduler = self._ov_genai.SchedulerConfig()
        scheduler.enable_prefix_caching = True
        scheduler.cache_size = CACHE_SIZE_GB
        scheduler.max_num_batched_tokens = MAX_NUM_BATCHED_TOKENS
        kwargs: dict[str, Any] = {
            "scheduler_config": scheduler,
            "INFERENCE_NUM_THREADS": self._threads,
        }
        if self._prompt_lookup:
            kwargs["prompt_lookup"] = True
        return self._ov_genai.LLMPipeline(self._gguf_path, "CPU", **kwargs)

    def _config(self, max_new_tokens: int, *, ignore_eos: bool) -> Any:
        config = self._ov_genai.GenerationConfig()
        config.max_new_tokens = max_new_tokens
        config.ignore_eos = ignore_eos
        config.do_sample = False
        config.eos_token_id = self._eos_token_id
        if self._prompt_lookup:
            config.num_assistant_tokens = self._num_assistant_tokens
            config.max_ngram_size = self._max_ngram_size
        return config

    def _generate(
        self, token_ids: Sequence[int], max_new_tokens: int, *, ignore_eos: bool
    ) -> tuple[Any, Any]:
        """Runs one greedy request; returns (EncodedResults, timing streamer)."""
        import numpy as np  # ships with openvino

        ids = check_prompt(token_ids)
        # A tensor input bypasses tokenization and chat templating: the model sees exactly `ids`.
        inputs = self._ov.Tensor(np.asarray([ids], dtype=np.int64))
        streamer = _make_streamer(self._ov_genai)
        streamer.limit = max_new_tokens
        config = self._config(max_new_tokens, ignore_eos=ignore_eos)
        streamer.t0 = time.perf_counter()
        result = self._pipe.generate(inputs, config, streamer)
        self.last_num_prompt_tokens = int(result.perf_metrics.get_num_input_tokens())
        return result, streamer

    def ttft(self, token_ids: Sequence[int]) -> float:
        _, streamer = self._generate(token_ids, 1, ignore_eos=True)
        # NOTE(peers): perf_metrics.get_ttft() agrees with the streamer to <1 ms; the streamer
        # timestamp is used so every peer is timed the same way (wall clock from submit).
        if not streamer.times:
            raise RuntimeError("openvino-genai produced no token")
        first: float = streamer.times[0]
        return first

    def reset_cache(self) -> None:
        # No API clears the prefix cache; drop the pipeline (and its KV blocks) before rebuilding
        # so two caches never coexist in RAM.
        self._pipe = None
        gc.collect()
        self._pipe = self._build_pipeline()

    def prefill_tok_s(self, token_ids: Sequence[int]) -> float:
        ids = check_prompt(token_ids)
        self.reset_cache()
        return len(ids) / self.ttft(ids)

    def decode_tok_s(self, prompt_ids: Sequence[int], num_tokens: int) -> float:
        check_num_tokens(num_tokens)
        _, streamer = self._generate(prompt_ids, num_tokens, ignore_eos=True)
        return timed_decode_tok_s(streamer.times, streamer.counts)

    def generate_greedy(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        if max_tokens <= 0:
            return []
        result, _ = self._generate(token_ids, max_tokens, ignore_eos=False)
        out = [int(t) for t in result.tokens[0]]
        # Same convention as the llama.cpp peer: the EOS id itself is not part of the output.
        return out[:-1] if out and out[-1] == self._eos_token_id else out

    def close(self) -> None:
        self._pipe = None
        gc.collect()
