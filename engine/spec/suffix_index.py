"""An n-gram suffix index over a growing token sequence: where did the current suffix occur last,
and what followed it there?

`add(token_ids)` appends; `match(context, max_len)` finds the longest n (max_ngram down to
min_ngram) such that the last n tokens of `context` occurred in the indexed sequence with at least
one token after them, and returns (n, the tokens that followed, up to max_len). The most recent
occurrence wins: agents re-emit what they saw last (the file as it is now, the latest call).
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_NGRAM = 2
MAX_NGRAM = 6


class SuffixIndex:
    def __init__(self, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM) -> None:
        assert 1 <= min_ngram <= max_ngram
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.token_ids: list[int] = []
        # n-gram -> end (exclusive) of its latest occurrence that has a following token.
        self._ends: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.token_ids)

    def add(self, token_ids: Sequence[int]) -> None:
        seq = self.token_ids
        for token_id in token_ids:
            end = len(seq)  # the n-grams ending here now have a follower: token_id
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._ends[tuple(seq[end - n : end])] = end
            seq.append(token_id)

    def match(self, context: Sequence[int], max_len: int) -> tuple[int, list[int]]:
        """(n, continuation): the longest matching suffix length and what followed it; (0, [])
        when no suffix of at least min_ngram tokens occurred."""
        if max_len <= 0:
            return 0, []
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            end = self._ends.get(tuple(context[len(context) - n :]))
            if end is not None:
                return n, self.token_ids[end : end + max_len]
        return 0, []

    def check_invariants(self) -> None:
        seq = self.token_ids
        for gram, end in self._ends.items():
            n = len(gram)
            assert self.min_ngram <= n <= self.max_ngram
            assert n <= end < len(seq), f"{gram} ends at {end} without a follower"
            assert tuple(seq[end - n : end]) == gram
