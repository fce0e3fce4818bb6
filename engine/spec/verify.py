"""Exact acceptance of draft tokens against the target model's logits.

Rows: logits[i] is the target's distribution for the token after draft[:i] (row 0 follows the
last real token). Greedy: accept the longest prefix of the draft that equals the argmax, then
take the argmax after it. Sampling (the drafter proposes one token with certainty, q = δ(d)):
accept d with probability p(d); on rejection sample from the residual max(p - q, 0), i.e. p with d
removed and renormalised; after a fully accepted draft, sample a bonus token from the last row.
Either way the output has exactly the distribution of plain decoding.

With a grammar, row i is masked by the grammar's state after draft[:i]: the verifier walks the
grammar through accepted drafts and rolls it back at the end, so the caller advances it over the
emitted tokens exactly as in plain decoding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.constrained.base import TokenGrammar
from engine.sampling import TokenChoice, filtered_probs, sample_row, with_logprobs
from engine.sampling_params import SamplingParams

# Masks one (1, vocab) logits row in place with the grammar's current allowed tokens.
RowMasker = Callable[[torch.Tensor, TokenGrammar], None]


def _accept_or_replace(row: torch.Tensor, draft_id: int, params: SamplingParams,
                       generator: torch.Generator | None) -> int:
    """The token emitted at a drafted position: draft_id itself when accepted."""
    if params.is_greedy:
        return int(torch.argmax(row))
    probs = filtered_probs(row, params)
    if float(torch.rand((), generator=generator)) < float(probs[draft_id]):
        return draft_id
    residual = probs.clone()
    residual[draft_id] = 0.0
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


def verify_draft(logits: torch.Tensor, draft_ids: list[int], params: SamplingParams,
                 generator: torch.Generator | None, grammar: TokenGrammar | None = None,
                 mask: RowMasker | None = None) -> tuple[list[TokenChoice], int]:
    """logits: (len(draft_ids) + 1, vocab) fp32 (masked rows are written in place). Returns the
    tokens to emit (accepted drafts, then one corrected or bonus token, unless the grammar ended
    inside the draft) and the number of draft tokens accepted."""
    num_draft = len(draft_ids)
    assert logits.shape[0] == num_draft + 1
    if grammar is None and params.is_greedy:
        targets = torch.argmax(logits, dim=-1).tolist()
        num_accepted = 0
        while num_accepted < num_draft and targets[num_accepted] == draft_ids[num_accepted]:
            num_accepted += 1
        tokens = targets[: num_accepted + 1]
        return [with_logprobs(logits[i], t, params) for i, t in enumerate(tokens)], num_accepted
    choices: list[TokenChoice] = []
    walked = 0  # grammar steps taken here, undone before returning
    try:
        for i, draft_id in enumerate(draft_ids):
            if grammar is not None and mask is not None:
                mask(logits[i : i + 1], grammar)
            token_id = _accept_or_replace(logits[i], draft_id, params, generator)
            choices.append(with_logprobs(logits[i], token_id, params))
            if token_id != draft_id:
                return choices, i
            if grammar is not None:
                walked += grammar.accept_token(draft_id)
                if grammar.is_terminated:  # a stop token inside the draft ends the output
                    return choices, i + 1
        if grammar is not None and mask is not None:
            mask(logits[num_draft:], grammar)
        choices.append(sample_row(logits[num_draft], params, generator))
        return choices, num_draft
    finally:
        if grammar is not None:
            grammar.rollback(walked)
