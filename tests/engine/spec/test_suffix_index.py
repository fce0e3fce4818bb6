"""SuffixIndex against a brute-force search, driven by hypothesis; the drafter's corpora."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.spec.suffix_index import SuffixIndex


def brute_match(seq: list[int], context: list[int], lo: int, hi: int,
                max_len: int) -> tuple[int, list[int]]:
    for n in range(min(hi, len(context)), lo - 1, -1):
        gram = context[len(context) - n :]
        for end in range(len(seq) - 1, n - 1, -1):  # latest occurrence with a follower
            if seq[end - n : end] == gram:
                return n, seq[end : end + max_len]
    return 0, []


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.lists(st.integers(0, 4), max_size=12), min_size=1, max_size=6),
       context=st.lists(st.integers(0, 4), min_size=1, max_size=10),
       max_len=st.integers(1, 6))
def test_match_equals_brute_force(chunks: list[list[int]], context: list[int],
                                  max_len: int) -> None:
    index = SuffixIndex(min_ngram=2, max_ngram=5)
    seq: list[int] = []
    for chunk in chunks:
        index.add(chunk)
        seq.extend(chunk)
        index.check_invariants()
        assert index.match(context, max_len) == brute_match(seq, context, 2, 5, max_len)


def test_own_suffix_never_matches_itself() -> None:
    index = SuffixIndex()
    index.add([1, 2, 3])
    assert index.match([1, 2, 3], 4) == (0, [])
    index.add([1, 2, 3])
    assert index.match([1, 2, 3, 1, 2, 3], 4) == (3, [1, 2, 3])
