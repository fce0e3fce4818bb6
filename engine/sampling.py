"""Next-token selection over a batch of fp32 logits, one generator per request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams


@dataclass
class TokenChoice:
    token_id: int
    logprob: float | None = None  # log p(token) under the unmodified distribution, when asked
    top_logprobs: list[tuple[int, float]] | None = None


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A per-request RNG: a seeded request draws the same numbers whatever shares its batch."""
    if params.is_greedy:
        return None
    gen = torch.Generator()
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to one row of logits (vocab,) -> probabilities."""
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest set whose mass reaches top_p: drop a token once the mass before it does.
        drop = (cumulative - sorted_probs) >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


def sample_row(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> TokenChoice:
    """Pick one token from (vocab,) fp32 logits."""
    if params.is_greedy:
        token_id = int(torch.argmax(logits).item())
    else:
        probs = filtered_probs(logits, params)
        token_id = int(torch.multinomial(probs, 1, generator=generator).item())
    return with_logprobs(logits, token_id, params)


def with_logprobs(logits: torch.Tensor, token_id: int, params: SamplingParams) -> TokenChoice:
    """The choice of `token_id` from (vocab,) logits, with its logprob and the top logprobs when
    `params.logprobs` asks for them (under the unmodified distribution)."""
    if params.logprobs is None:
        return TokenChoice(token_id)
    logprobs = torch.log_softmax(logits, dim=-1)
    top: list[tuple[int, float]] = []
    if params.logprobs > 0:
        values, ids = torch.topk(logprobs, params.logprobs)
        top = [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return TokenChoice(token_id, float(logprobs[token_id].item()), top)


def sample_batch(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[TokenChoice]:
    """(B, vocab) fp32 logits -> one choice per row. Greedy rows share one argmax call."""
    if all(p.is_greedy and p.logprobs is None for p in params):
        return [TokenChoice(int(t)) for t in torch.argmax(logits, dim=-1).tolist()]
    return [sample_row(logits[i], p, g) for i, (p, g) in enumerate(zip(params, generators,
                                                                         strict=True))]
