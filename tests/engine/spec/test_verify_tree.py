"""Draft-tree verification: a chain tree reproduces `verify_draft`, greedy follows the matching
sibling, sampling keeps the target's output distribution (chi-square on fixed seeds, so each run is
deterministic; thresholds stated per test), and a grammar masks only the accepted path and is
always rolled back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import torch

import engine.spec.verify_tree as verify_tree_module
from engine.constrained.base import TokenGrammar
from engine.constrained.xgrammar_backend import XGrammarBackend
from engine.sampling import TokenChoice, filtered_probs
from engine.sampling_params import SamplingParams
from engine.spec.verify import verify_draft
from engine.spec.verify_tree import tree_depths, verify_tree
from engine.tokenizer import Tokenizer
from gateway.tool_prompt import normalize_tools, tool_constraint
from tests.toolcall_tools import TOOLS

P_MIN = 1e-3  # a correct rule must not be rejected below this p-value
P_WRONG = 1e-6  # a wrong rule must be rejected below this one

Output = tuple[int, ...]  # the tokens one verification emits, or a prefix of them


class ParityGrammar:
    """Each token's parity must differ from the previous token's; STOP (0) terminates."""

    STOP = 0

    def __init__(self, vocab_size: int, history: list[int] | None = None) -> None:
        self.vocab_size = vocab_size
        self.history = list(history or [])

    def allows(self, token_id: int) -> bool:
        return not self.is_terminated and (not self.history
                                           or token_id % 2 != self.history[-1] % 2)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        bitmask[row] = 0
        for token_id in filter(self.allows, range(self.vocab_size)):
            bitmask[row, token_id // 32] |= 1 << (token_id % 32)
        return True

    def accept_token(self, token_id: int) -> bool:
        if not self.allows(token_id):
            return False
        self.history.append(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > len(self.history):
            raise ValueError("rollback past the start")
        del self.history[len(self.history) - num_tokens:]

    @property
    def is_terminated(self) -> bool:
        return bool(self.history) and self.history[-1] == self.STOP

    @property
    def num_accepted(self) -> int:
        return len(self.history)


def mask_with_bitmask(rows: torch.Tensor, grammar: TokenGrammar) -> None:
    bitmask = torch.zeros(1, -(-rows.shape[-1] // 32), dtype=torch.int32)
    if grammar.fill_next_token_bitmask(bitmask, 0):
        bits = (bitmask[0, torch.arange(rows.shape[-1]) // 32]
                >> (torch.arange(rows.shape[-1]) % 32)) & 1
        rows[0].masked_fill_(bits == 0, float("-inf"))


def chain(n: int) -> list[int]:
    return list(range(-1, n - 1))


def random_case(gen: torch.Generator, num_draft: int, vocab_size: int) -> tuple[torch.Tensor,
                                                                                   list[int]]:
    """Random logits and a draft that often agrees with the rows' argmax (so some is accepted)."""
    logits = torch.randn(num_draft + 1, vocab_size, generator=gen) * 2
    argmax = logits.argmax(-1).tolist()
    draft = [argmax[i] if torch.rand((), generator=gen) < 0.75
             else int(torch.randint(vocab_size, (), generator=gen)) for i in range(num_draft)]
    return logits, draft


def test_tree_depths() -> None:
    assert tree_depths([]) == []
    assert tree_depths([-1, -1, 0, 2, 1, 3]) == [1, 1, 2, 3, 2, 4]
    with pytest.raises(ValueError, match="parent of node 1"):
        tree_depths([-1, 1])


@pytest.mark.parametrize(("num_rows", "token_ids", "parents", "message"), [
    (3, [1, 2], [-1], "1 parents for 2 draft tokens"),
    (2, [1, 2], [-1, 0], r"shape \(3, vocab\)"),
    (3, [1, 2], [-1, 2], "parent of node 1 must be in"),
    (3, [1, 2], [-2, 0], "parent of node 0 must be in"),
])
def test_rejects_inconsistent_trees(num_rows: int, token_ids: list[int], parents: list[int],
                                    message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verify_tree(torch.zeros(num_rows, 8), token_ids, parents, SamplingParams(), None)


@pytest.mark.parametrize("params", [SamplingParams(logprobs=3), SamplingParams(),
                                    SamplingParams(temperature=0.7, top_p=0.9, logprobs=2)])
def test_chain_tree_equals_verify_draft(params: SamplingParams) -> None:
    """Tokens, logprobs and (sampling, same seed) random draws all match, with and without a
    grammar."""
    gen = torch.Generator().manual_seed(7)
    for trial in range(60):
        # Odd trials: no grammar. Even ones: a small vocabulary, so drafts often hit the stop.
        vocab_size = 50 if trial % 2 else 6
        logits, draft = random_case(gen, trial % 7, vocab_size)
        grammars = ([None] if trial % 2
                    else [ParityGrammar(vocab_size, [3]), ParityGrammar(vocab_size, [3])])
        results = []
        for run, fn in enumerate(("tree", "draft")):
            rng = None if params.is_greedy else torch.Generator().manual_seed(trial)
            grammar = grammars[run % len(grammars)]
            mask = mask_with_bitmask if grammar else None
            if fn == "tree":
                choices, path = verify_tree(logits.clone(), draft, chain(len(draft)), params, rng,
                                            grammar, mask)
            else:
                choices, num_accepted = verify_draft(logits.clone(), draft, params, rng, grammar,
                                                     mask)
                path = list(range(num_accepted))
            assert grammar is None or grammar.num_accepted == 1
            results.append((choices, path))
        assert results[0] == results[1], trial


def test_greedy_follows_the_matching_sibling() -> None:
    #            node: 0   1  2  3  4
    token_ids = [5, 2, 2, 4, 1]
    parents = [-1, -1, -1, 1, 1]
    logits = torch.zeros(6, 8)
    logits[0, 2] = 3.0  # root: argmax 2, held by nodes 1 and 2; the first in index order wins
    logits[2, 1] = 2.0  # after node 1: argmax 1 -> node 4 (a leaf)
    logits[5, 6] = 1.0  # after node 4: bonus 6
    choices, path = verify_tree(logits, token_ids, parents, SamplingParams(logprobs=0), None)
    assert path == [1, 4]
    assert [c.token_id for c in choices] == [2, 1, 6]
    assert choices[0] == TokenChoice(2, float(torch.log_softmax(logits[0], -1)[2]), [])
    logits[2, 1], logits[2, 7] = 0.0, 2.0  # now no child of node 1 matches: emit 7 and stop
    choices, path = verify_tree(logits, token_ids, parents, SamplingParams(), None)
    assert (path, [c.token_id for c in choices]) == ([1], [2, 7])


# A tree over a 5-token vocabulary: three root children (node 2 repeats node 0's token, so it can
# never be accepted), grandchildren, a great-grandchild, and leaves that give bonus tokens.
TREE_TOKENS = [1, 3, 1, 0, 2, 4, 2]
TREE_PARENTS = [-1, -1, -1, 0, 0, 3, 1]
TREE_LOGITS = torch.tensor([
    [0.5, 1.2, -0.3, 0.8, -2.0],   # root (top-k 4 drops token 4)
    [0.9, -0.5, 0.4, 0.2, -1.0],   # after node 0
    [0.1, 0.3, 1.0, -0.2, 0.6],    # after node 1
    [0.9, -0.5, 0.4, 0.2, -1.0],   # after node 2: the same context as node 0
    [-0.3, 0.2, 0.0, 0.5, 1.1],    # after node 3
    [0.3, 0.0, -0.4, 1.0, 0.2],    # after node 4 (leaf)
    [1.0, 0.5, 0.0, -0.5, -1.0],   # after node 5 (leaf)
    [0.0, 0.0, 0.7, 0.7, -0.7],    # after node 6 (leaf)
])
TREE_PARAMS = SamplingParams(temperature=0.8, top_k=4)


def target_outputs(logits: torch.Tensor, token_ids: list[int], parents: list[int],
                   params: SamplingParams) -> dict[Output, float]:
    """The exact distribution of what verification emits: plain sampling from the target, cut
    after the first token that leaves the tree (or the bonus token at a leaf)."""
    children: list[dict[int, int]] = [{} for _ in range(len(token_ids) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].setdefault(token_ids[node], node)  # the first child holding a token
    outputs: dict[Output, float] = {}

    def walk(row: int, prefix: Output, prob: float) -> None:
        for token_id, p in enumerate(filtered_probs(logits[row], params).double().tolist()):
            if p == 0.0:
                continue
            if token_id in children[row]:
                walk(children[row][token_id] + 1, (*prefix, token_id), prob * p)
            else:
                outputs[(*prefix, token_id)] = prob * p

    walk(0, (), 1.0)
    return outputs


def chi_square_p(observed: Counter[Output], expected: dict[Output, float]) -> float:
    """Goodness of fit of `observed` counts to the probabilities `expected` (upper-tail p); 0 when
    an output `expected` gives no probability was observed."""
    if not set(observed) <= set(expected):
        return 0.0
    total = sum(observed.values())
    assert min(expected.values()) * total >= 5, "cells too small for the chi-square test"
    stat = sum((observed[k] - total * p) ** 2 / (total * p) for k, p in expected.items())
    dof = torch.tensor((len(expected) - 1) / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(stat / 2.0, dtype=torch.float64)))


def tree_fit_p_values(num_trials: int, seed: int) -> list[float]:
    """p-values for the first emitted token, the first two, and the whole output."""
    exact = target_outputs(TREE_LOGITS, TREE_TOKENS, TREE_PARENTS, TREE_PARAMS)
    gen = torch.Generator().manual_seed(seed)
    outputs: Counter[Output] = Counter()
    for _ in range(num_trials):
        choices, path = verify_tree(TREE_LOGITS, TREE_TOKENS, TREE_PARENTS, TREE_PARAMS, gen)
        assert len(choices) == len(path) + 1
        assert [TREE_TOKENS[n] for n in path] == [c.token_id for c in choices[:-1]]
        outputs[tuple(c.token_id for c in choices)] += 1
    p_values = []
    for cut in (1, 2, 4):
        observed: Counter[Output] = Counter()
        expected: dict[Output, float] = {}
        for key, count in outputs.items():
            observed[key[:cut]] += count
        for key, p in exact.items():
            expected[key[:cut]] = expected.get(key[:cut], 0.0) + p
        p_values.append(chi_square_p(observed, expected))
    return p_values


def test_sampled_tree_matches_target_distribution() -> None:
    p_values = tree_fit_p_values(30_000, seed=1234)
    # With this seed the p-values are ~(0.41, 0.69, 0.40); seeds 0-2 give 0.03 to 0.87.
    assert min(p_values) > P_MIN, p_values


def accept_without_renormalising(row: torch.Tensor, nodes: list[int], token_ids: list[int],
                                 params: SamplingParams, generator: torch.Generator | None
                                 ) -> tuple[int | None, int]:
    probs = filtered_probs(row, params)
    for node in nodes:
        if float(torch.rand((), generator=generator)) < float(probs[token_ids[node]]):
            return node, token_ids[node]
        probs[token_ids[node]] = 0.0  # the next child is tested against the unnormalised rest
    return None, int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def fall_back_to_unrejected_probs(row: torch.Tensor, nodes: list[int], token_ids: list[int],
                                  params: SamplingParams, generator: torch.Generator | None
                                  ) -> tuple[int | None, int]:
    probs = filtered_probs(row, params)
    residual = probs.clone()
    for node in nodes:
        if float(torch.rand((), generator=generator)) < float(residual[token_ids[node]]):
            return node, token_ids[node]
        residual[token_ids[node]] = 0.0
        residual = residual / residual.sum()
    return None, int(torch.multinomial(probs, 1, generator=generator))  # should be the residual


@pytest.mark.parametrize("wrong_rule", [accept_without_renormalising,
                                        fall_back_to_unrejected_probs])
def test_distribution_test_rejects_wrong_rules(
        monkeypatch: pytest.MonkeyPatch,
        wrong_rule: Callable[..., tuple[int | None, int]]) -> None:
    """The distribution test has the power to catch plausible mistakes, with fewer trials."""
    monkeypatch.setattr(verify_tree_module, "_sample_children", wrong_rule)
    # With this seed the p-values are < 1e-130 (no renormalising), and 0 (fallback: it emits a
    # rejected child's token as the correction, an output the target cannot produce).
    assert min(tree_fit_p_values(5_000, seed=99)) < P_WRONG


def test_grammar_masks_only_the_accepted_path_and_is_rolled_back() -> None:
    #            node: 0  1  2  3  4  5
    token_ids = [5, 2, 4, 7, 0, 6]
    parents = [-1, -1, 1, 1, 3, 4]
    logits = torch.zeros(7, 8)
    logits[0, [5, 2]] = torch.tensor([3.0, 2.0])  # raw argmax 5, but after 3 only evens are allowed
    logits[2, [4, 7]] = torch.tensor([3.0, 2.0])  # after 2 only odds: 7 -> node 3
    logits[4, 0] = 1.0  # after 7: stop -> node 4, which ends the output without a bonus token
    original = logits.clone()
    grammar = ParityGrammar(8, history=[3])
    choices, path = verify_tree(logits, token_ids, parents, SamplingParams(), None, grammar,
                                mask_with_bitmask)
    assert path == [1, 3, 4]
    assert [c.token_id for c in choices] == [2, 7, 0]
    assert grammar.history == [3]
    for row in (1, 3, 5, 6):  # off the path, or past the stop: untouched
        assert torch.equal(logits[row], original[row]), row
    for row, last in ((0, 3), (2, 2), (4, 7)):
        expected = original[row].clone()
        expected[torch.arange(8) % 2 == last % 2] = float("-inf")
        assert torch.equal(logits[row], expected), row


def test_sampled_tree_obeys_the_grammar() -> None:
    gen = torch.Generator().manual_seed(5)
    params = SamplingParams(temperature=1.0)
    for trial in range(200):
        logits = torch.randn(8, 6, generator=gen)
        start = 1 + trial % 5  # not the stop token
        grammar = ParityGrammar(6, history=[start])
        choices, path = verify_tree(logits, [1, 2, 3, 0, 4, 5, 1], [-1, -1, 0, 0, 2, 1, 5],
                                    params, gen, grammar, mask_with_bitmask)
        assert grammar.history == [start]
        assert all(grammar.accept_token(c.token_id) for c in choices), trial
        # No extra token only when an accepted node was the stop token.
        assert len(choices) == len(path) + 1 or (
            len(choices) == len(path) and choices[-1].token_id == ParityGrammar.STOP)


def test_grammar_is_rolled_back_when_masking_fails() -> None:
    grammar = ParityGrammar(8, history=[1])
    calls = []

    def failing_mask(rows: torch.Tensor, g: TokenGrammar) -> None:
        calls.append(g.num_accepted)
        if len(calls) == 3:
            raise RuntimeError("mask failed")
        mask_with_bitmask(rows, g)

    logits = torch.zeros(4, 8)
    logits[[0, 1, 2], [2, 3, 4]] = 1.0
    with pytest.raises(RuntimeError, match="mask failed"):
        verify_tree(logits, [2, 3, 4], chain(3), SamplingParams(), None, grammar, failing_mask)
    assert calls == [1, 2, 3] and grammar.history == [1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_real_grammar_steers_past_forbidden_siblings(real_tokenizer: Tokenizer,
                                                     temperature: float) -> None:
    """Every depth offers a token the tool-call grammar forbids first (with the higher raw logit),
    then the call's own token: the masked rows choose the call, which ends at the stop token."""
    constraint = tool_constraint(normalize_tools(TOOLS), {"name": "get_weather"})
    assert constraint is not None
    backend = XGrammarBackend(real_tokenizer, real_tokenizer.vocab_size)
    stop_ids = list(real_tokenizer.stop_token_ids)
    grammar = backend.new_grammar(constraint, stop_ids)
    call = real_tokenizer.encode('<tool_call>\n{"name": "get_weather", "arguments": '
                                 '{"city": "Oslo", "unit": "celsius"}}\n</tool_call>')
    call.append(stop_ids[0])
    vocab_size = real_tokenizer.vocab_size
    token_ids: list[int] = []
    parents: list[int] = []
    for token_id in call:  # a forbidden decoy, then the call's token, under the previous call node
        bitmask = torch.zeros(1, -(-vocab_size // 32), dtype=torch.int32)
        grammar.fill_next_token_bitmask(bitmask, 0)
        decoy = next(t for t in range(vocab_size) if not bitmask[0, t // 32] >> (t % 32) & 1)
        parent = len(token_ids) - 1 if token_ids else -1
        token_ids += [decoy, token_id]
        parents += [parent, parent]
        assert grammar.accept_token(token_id)
    grammar.rollback(len(call))
    logits = torch.randn(len(token_ids) + 1, vocab_size, generator=torch.Generator().manual_seed(0))
    for depth in range(len(call)):
        row = 2 * depth  # row 0, then the row after each call node (node 2 * depth - 1)
        logits[row, token_ids[2 * depth]] = 40.0
        logits[row, token_ids[2 * depth + 1]] = 30.0
    params = SamplingParams(temperature=temperature)
    rng = None if params.is_greedy else torch.Generator().manual_seed(1)
    choices, path = verify_tree(logits, token_ids, parents, params, rng, grammar,
                                lambda rows, g: backend.mask_logits(rows, [g]))
    assert [c.token_id for c in choices] == call  # the stop token ends it: no bonus token
    assert path == [2 * depth + 1 for depth in range(len(call))]
    assert grammar.num_accepted == 0
