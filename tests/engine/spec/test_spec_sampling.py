"""Speculative sampling keeps the output distribution of plain sampling (chi-square tests, fixed
seeds, so each run is deterministic; the p-value thresholds are stated per test)."""

from __future__ import annotations

from collections import Counter

import torch

from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling import filtered_probs
from engine.sampling_params import SamplingParams
from engine.spec.model_drafter import ModelDrafter
from engine.spec.speculator import Speculator
from engine.spec.verify import verify_draft

P_MIN = 1e-3  # reject "same distribution" only below this p-value


def chi_square_p(stat: float, dof: int) -> float:
    """Upper tail of the chi-square distribution: Q(dof / 2, stat / 2)."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def goodness_of_fit_p(counts: Counter[int], probs: torch.Tensor) -> float:
    total = sum(counts.values())
    cells = [i for i in range(len(probs)) if probs[i] > 0]
    assert all(k in cells for k in counts), "a token with zero probability was emitted"
    stat = sum((counts.get(i, 0) - total * float(probs[i])) ** 2 / (total * float(probs[i]))
               for i in cells)
    return chi_square_p(stat, len(cells) - 1)


def homogeneity_p(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test that a and b come from one distribution."""
    n_a, n_b = sum(a.values()), sum(b.values())
    stat = 0.0
    keys = set(a) | set(b)
    for key in keys:
        total = a.get(key, 0) + b.get(key, 0)
        for observed, n in ((a.get(key, 0), n_a), (b.get(key, 0), n_b)):
            expected = total * n / (n_a + n_b)
            stat += (observed - expected) ** 2 / expected
    return chi_square_p(stat, len(keys) - 1)


def test_verify_draft_matches_target_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -9.0],
                           [0.0, 1.5, 0.2, 1.0, -0.5, 0.3],
                           [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]])
    params = SamplingParams(temperature=0.9, top_k=5)
    gen = torch.Generator().manual_seed(1234)
    first: Counter[int] = Counter()
    second: Counter[int] = Counter()
    for _ in range(20_000):
        choices, num_accepted = verify_draft(logits, [1, 3], params, gen)
        assert len(choices) == num_accepted + 1
        first[choices[0].token_id] += 1
        if choices[0].token_id == 1:  # draft 1 accepted: the next token follows row 1
            second[choices[1].token_id] += 1
    p_first = goodness_of_fit_p(first, filtered_probs(logits[0], params))
    p_second = goodness_of_fit_p(second, filtered_probs(logits[1], params))
    # With this seed: p_first ~0.5, p_second ~0.3 (printed on failure).
    assert p_first > P_MIN and p_second > P_MIN, (p_first, p_second)


def sample_triples(loaded: LoadedModel, spec: bool, num: int) -> Counter[tuple[int, ...]]:
    engine = Engine(loaded, EngineConfig(page_size=4, kv_memory_bytes=32 << 20, max_running=256,
                                         max_batch_tokens=4096, spec="none"))
    if spec:
        engine.speculator = Speculator(ModelDrafter(loaded, 2, kv_memory_bytes=16 << 20), 2)
    prompt = loaded.tokenizer.encode("The quick brown fox")
    for i in range(num):
        params = SamplingParams(max_tokens=3, temperature=1.0, top_k=3, seed=i + (10**6 if spec
                                                                                 else 0),
                                ignore_eos=True)
        engine.submit(Extend(f"r{i}", "ns", None, prompt, params))
    done = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
    if spec:
        assert engine.stats().num_drafted > 0
    return Counter(tuple(m.output_token_ids) for m in done)


def test_engine_spec_sampling_matches_plain_sampling(tiny: LoadedModel) -> None:
    """Three tokens from top-3 sampling of a random model, 800 samples each way: drafted by the
    target itself (drafts accepted with p(x), residual on rejection) vs plain sampling."""
    plain = sample_triples(tiny, spec=False, num=800)
    spec = sample_triples(tiny, spec=True, num=800)
    p_value = homogeneity_p(plain, spec)
    print(f"homogeneity p-value {p_value:.3f} over {len(plain | spec)} cells")
    assert p_value > P_MIN, p_value
