"""The interface every peer engine implements, plus small timing helpers they share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Peer(Protocol):
    """One peer engine, loaded once on one GGUF file with a fixed thread count.

    All methods take and return token ids (the same ids radixgate is fed); none applies a chat
    template or adds a BOS token. Peers are single-user: calls must not run concurrently.
    """

    name: str
    """Short column label, e.g. "llama.cpp" or "openvino-genai"."""
    load_s: float
    """Seconds the first model load took (measured once, never included in TTFT)."""
    last_cached_len: int | None
    """Prompt tokens the last `ttft` call reused from the peer's cache; None if it can't tell."""

    def ttft(self, token_ids: Sequence[int]) -> float:
        """Seconds from submitting `token_ids` to the first generated token (greedy).

        Uses the peer's own prefix caching: a prompt that extends an earlier one reuses the cached
        prefix (the "warm" case). Mutates the peer's cache. Raises ValueError on an empty prompt.
        """
        ...

    def reset_cache(self) -> None:
        """Drop every cached prefix, so the next `ttft` is cold. May take seconds (see peer)."""
        ...

    def prefill_tok_s(self, token_ids: Sequence[int]) -> float:
        """Cold prefill rate: len(token_ids) / TTFT after `reset_cache()`. Leaves it cached."""
        ...

    def decode_tok_s(self, prompt_ids: Sequence[int], num_tokens: int) -> float:
        """Batch-1 greedy decode rate in tokens/s, EOS ignored.

        Timed from the first generated token to the last, so prefill is excluded:
        (tokens generated - 1) / (t_last - t_first). Raises ValueError if num_tokens < 2.
        """
        ...

    def generate_greedy(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Greedy continuation of `token_ids`: at most `max_tokens` ids, stopping at EOS."""
        ...

    def close(self) -> None:
        """Release the model and its KV cache. The peer is unusable afterwards."""
        ...


def check_prompt(token_ids: Sequence[int]) -> list[int]:
    """`token_ids` as a list of ints; raises ValueError if it is empty."""
    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("prompt must hold at least one token id")
    return ids


def check_num_tokens(num_tokens: int) -> None:
    """Raises ValueError unless at least two tokens are asked for (one interval to time)."""
    if num_tokens < 2:
        raise ValueError(f"num_tokens must be >= 2 to time decode, got {num_tokens}")


def timed_decode_tok_s(token_times: Sequence[float], num_tokens_at: Sequence[int]) -> float:
    """Decode rate from per-callback timestamps.

    `token_times[i]` is when callback i fired and `num_tokens_at[i]` how many tokens had been
    produced by then (speculative peers emit several per callback). The first callback carries the
    prefill, so the rate is (tokens after it) / (time after it). Raises ValueError if fewer than two
    callbacks fired.
    """
    if len(token_times) < 2 or len(token_times) != len(num_tokens_at):
        raise ValueError("need at least two timed callbacks to compute a decode rate")
    elapsed = token_times[-1] - token_times[0]
    produced = num_tokens_at[-1] - num_tokens_at[0]
    return produced / elapsed if elapsed > 0 else float("inf")
