"""The per-request grammar interface the sampler and draft verification talk to.

A `TokenGrammar` is the state of one request's grammar over token ids. Sampling asks it for the
allowed-token mask of the next position, masks the logits and samples, then advances it with the
chosen token. Speculative-draft verification walks a draft the same way (mask, accept, mask,
accept, ...) and rolls back the tokens the target rejected.

Bitmask layout (xgrammar's): int32, shape (num_rows, ceil(vocab_size / 32)), on CPU; bit j % 32 of
word j // 32 of a row is 1 when token j is allowed.
"""

from __future__ import annotations

from typing import Protocol

import torch


class TokenGrammar(Protocol):
    """Mutable, one per request, not thread-safe."""

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed tokens of the next position into `bitmask[row]` (layout above).
        Does not change the state. Returns False when every token is allowed (no need to mask)."""
        ...

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token. Returns False, leaving the state unchanged, if the grammar
        forbids `token_id` at this position."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens. Raises ValueError if fewer were accepted."""
        ...

    @property
    def is_terminated(self) -> bool:
        """True once a stop token was accepted; no mask can be filled after that."""
        ...

    @property
    def num_accepted(self) -> int:
        """Tokens accepted and not rolled back."""
        ...
