"""Drafts checked against the grammar before verification: forbidden nodes and their subtrees
go, the grammar's state is left as it was."""

from __future__ import annotations

from engine.spec.grammar_prune import prune_draft
from tests.engine.spec.test_verify_tree import ParityGrammar


def test_forbidden_nodes_and_their_subtrees_go() -> None:
    grammar = ParityGrammar(10, history=[3])  # next must be even
    #        0: 4 ok   1: 5 no   2: 7 (child of 1)   3: 6 no (child of 0)   4: 9 ok (child of 0)
    #        5: 2 ok (child of 4)   6: 8 ok (root)
    tokens = [4, 5, 7, 6, 9, 2, 8]
    parents = [-1, -1, 1, 0, 0, 4, -1]
    kept_tokens, kept_parents = prune_draft(grammar, tokens, parents)
    assert kept_tokens == [4, 9, 2, 8]
    assert kept_parents == [-1, 0, 1, -1]
    assert grammar.history == [3]


def test_a_chain_is_cut_at_its_first_forbidden_token_and_after_a_stop() -> None:
    grammar = ParityGrammar(10, history=[1])
    assert prune_draft(grammar, [2, 3, 4, 4, 5], [-1, 0, 1, 2, 3]) == ([2, 3, 4], [-1, 0, 1])
    # STOP (0) is even: allowed after an odd token, and nothing follows it.
    assert prune_draft(grammar, [0, 1], [-1, 0]) == ([0], [-1])
    assert grammar.history == [1]
    assert prune_draft(grammar, [], []) == ([], [])
