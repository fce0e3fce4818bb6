"""llama-cpp-python peer: llama.cpp's CPU kernels on the same GGUF, single-sequence KV.

Its "prefix cache" is the prompt-prefix reuse of one `Llama` object: `generate` keeps the longest
common prefix of the previous sequence (prompt plus evaluated output) in the KV cache and evaluates
only the rest. Only the most recent sequence is kept, so a fork back to an older branch is a miss
past the fork point. `reset_cache()` calls `Llama.reset()`, which is instant.

On a CPU with AMX-INT8 the model loads with llama.cpp's extra buffer types off (its `--no-repack`):
the AMX buffer's matmul segfaults on this GGUF there (ggml-org/llama.cpp#20824, open), which would
take the whole benchmark process down. The AVX-512/VNNI kernels still run.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.peers.base import check_num_tokens, check_prompt, timed_decode_tok_s

# engine.cpu_isa imports no torch: a peer's ready-time probe (benchmarks.ready_probe) stays free
# of it.
from engine.cpu_isa import flags as cpu_flags

N_CTX = 8192  # SmolLM2's trained context window


@contextmanager
def _model_params(*, use_extra_bufts: bool) -> Iterator[None]:
    """`llama_cpp.Llama` has no argument for `use_extra_bufts`; while this block runs, the default
    model params it starts from carry the given value."""
    from llama_cpp import llama_cpp as lib

    defaults = lib.llama_model_default_params

    def patched() -> Any:
        params = defaults()
        params.use_extra_bufts = use_extra_bufts
        return params

    lib.llama_model_default_params = patched
    try:
        yield
    finally:
        lib.llama_model_default_params = defaults


class LlamaCppPeer:
    """`llama_cpp.Llama` with `n_threads = n_threads_batch = threads` and greedy sampling."""

    def __init__(self, gguf_path: str | Path, threads: int = 2, *, n_ctx: int = N_CTX) -> None:
        # Optional dependency: imported here so that importing this module never fails.
        import llama_cpp

        self.name = "llama.cpp"
        self.last_cached_len: int | None = None
        # AMX-INT8 is where llama.cpp puts quantised weights in its AMX buffer.
        self.extra_bufts = "amx_int8" not in cpu_flags()
        start = time.perf_counter()
        with _model_params(use_extra_bufts=self.extra_bufts):
            self._llm: Any = llama_cpp.Llama(
                model_path=str(gguf_path),
                n_ctx=n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                verbose=False,
            )
        self.load_s = time.perf_counter() - start
        self._eos_token_id = int(self._llm.token_eos())

    def _cached_len(self, ids: list[int]) -> int:
        """Prompt tokens `Llama.generate` will reuse (mirrors its prefix-match rule)."""
        cached_ids = list(self._llm.input_ids[: self._llm.n_tokens])
        common = 0
        for cached, new in zip(cached_ids, ids, strict=False):
            if cached != new:
                break
            common += 1
        if common < len(ids):
            return common
        # The whole prompt is cached: llama-cpp-python samples from the live logits when the
        # cache holds exactly the prompt, else it replays the last token to refresh them.
        if len(cached_ids) == len(ids) and not self._llm._requires_eval:
            return len(ids)
        return max(common - 1, 0)

    def _stream(self, ids: list[int]) -> Generator[int, Any, None]:
        """Greedy token stream for `ids`; never stops on its own (EOS is not special here)."""
        self.last_cached_len = self._cached_len(ids)
        stream: Generator[int, Any, None] = self._llm.generate(
            ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0
        )
        return stream

    def ttft(self, token_ids: Sequence[int]) -> float:
        ids = check_prompt(token_ids)
        start = time.perf_counter()
        stream = self._stream(ids)
        next(stream)
        elapsed = time.perf_counter() - start
        stream.close()
        return elapsed

    def reset_cache(self) -> None:
        self._llm.reset()

    def prefill_tok_s(self, token_ids: Sequence[int]) -> float:
        ids = check_prompt(token_ids)
        self.reset_cache()
        return len(ids) / self.ttft(ids)

    def decode_tok_s(self, prompt_ids: Sequence[int], num_tokens: int) -> float:
        check_num_tokens(num_tokens)
        ids = check_prompt(prompt_ids)
        times: list[float] = []
        start = time.perf_counter()
        stream = self._stream(ids)
        for _ in stream:
            times.append(time.perf_counter() - start)
            if len(times) >= num_tokens:
                break
        stream.close()
        return timed_decode_tok_s(times, list(range(1, len(times) + 1)))

    def generate_greedy(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        ids = check_prompt(token_ids)
        out: list[int] = []
        if max_tokens <= 0:
            return out
        stream = self._stream(ids)
        for token in stream:
            if token == self._eos_token_id:
                break
            out.append(int(token))
            if len(out) >= max_tokens:
                break
        stream.close()
        return out

    def close(self) -> None:
        self._llm.close()
