"""A declared public prefix shared across cache namespaces (`engine.scheduler.shared_prefix`):
only its whole pages cross namespaces, everything after them stays in the namespace that
computed it, and the trees stay consistent (`check_invariants` after every step) while each
tree evicts its copy on its own. Read from `Finished.cached_len`, never from timings."""

from __future__ import annotations

from engine.cache.base import PUBLIC_NAMESPACE
from engine.engine import Engine
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Failed
from engine.sampling_params import SamplingParams
from tests.engine.test_engine_core import finished, make_engine, prompt

PAGE = 4
PUBLIC = prompt(22, 100)  # 5 whole pages and 2 tokens
SHARED = len(PUBLIC) // PAGE * PAGE
PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


def run(engine: Engine, request_id: str, namespace: str, token_ids: list[int],
        shared_len: int = 0) -> int:
    """cached_len of one request, run to its end."""
    engine.submit(Extend(request_id, namespace, None, token_ids, PARAMS,
                         shared_prefix_len=shared_len))
    done = finished(engine.run_until_idle())[request_id]
    engine.check_invariants()
    return done.cached_len


def test_only_the_declared_pages_cross_namespaces(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    mine, theirs = PUBLIC + prompt(30, 900), PUBLIC + prompt(30, 2000)
    assert run(engine, "a1", "a", mine, len(PUBLIC)) == 0
    assert run(engine, "a2", "a", mine, len(PUBLIC)) >= len(mine) - PAGE  # its own repeat
    # b sends a's exact prompt: only the public prefix's whole pages are there for it
    assert run(engine, "b1", "b", mine, len(PUBLIC)) == SHARED
    assert run(engine, "b2", "b", theirs, len(PUBLIC)) == SHARED
    # undeclared, the same tokens are not shared: c holds nothing of a's or b's
    assert run(engine, "c1", "c", mine) == 0
    # a declaration shorter than the prefix shares only its own whole pages
    assert run(engine, "d1", "d", mine, 2 * PAGE + 1) == 2 * PAGE


def test_each_tree_evicts_its_copy_on_its_own(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    tokens = PUBLIC + prompt(9, 700)
    run(engine, "a1", "a", tokens, len(PUBLIC))
    run(engine, "b1", "b", tokens, len(PUBLIC))
    cache, pool = engine.cache, engine.page_pool
    shared_pages = cache.match_prefix(PUBLIC_NAMESPACE, tokens).page_ids
    assert len(shared_pages) == SHARED // PAGE
    # the same pages, one reference per tree: a's, b's and the public one
    for ns in ("a", "b"):
        assert cache.match_prefix(ns, tokens).page_ids[: len(shared_pages)] == shared_pages
    assert all(pool.ref_count(p) == 3 for p in shared_pages)
    while cache.num_cached_pages:  # least recently used first, whichever tree it is in
        assert cache.evict(1) > 0
        cache.check_invariants()
        holders = {ns: set(cache.match_prefix(ns, tokens).page_ids)
                   for ns in ("a", "b", PUBLIC_NAMESPACE)}
        for page_id in shared_pages:  # a page is free exactly when no tree holds it
            assert pool.ref_count(page_id) == sum(page_id in h for h in holders.values())
    assert run(engine, "b2", "b", tokens, len(PUBLIC)) == 0  # nothing left to share
    assert run(engine, "a2", "a", tokens, len(PUBLIC)) == SHARED  # b published it again
    engine.reset_cache()
    engine.check_invariants()
    assert cache.num_cached_pages == 0 and pool.num_free_pages == pool.num_pages


def test_the_public_namespace_is_not_a_request_namespace(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    out = engine.submit(Extend("p", PUBLIC_NAMESPACE, None, PUBLIC, PARAMS))
    assert len(out) == 1 and isinstance(out[0], Failed)
    assert out[0].error_type == "invalid_request"
