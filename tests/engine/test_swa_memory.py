"""Sliding-window memory in the engine (a tiny Gemma 3: 5 of 6 layers slide over 8 tokens,
4-token pages): the same greedy tokens as full-length KV through agent turns, retries and
concurrent requests, with every structure checked after each step; a request holds only its
window's sliding pages; and a prefix whose window was given back is recomputed from the
ledger, never read from freed pages (they are filled with NaN first)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from engine.disagg.decode_side import KvPuller
from engine.disagg.prefill_side import KvServer, kv_fingerprint
from engine.engine import Engine, EngineConfig
from engine.errors import InvalidRequest
from engine.models.loader import LoadedModel, load_model
from engine.protocol import Extend, Finished, KvAccept, KvConnect, Message
from engine.sampling_params import SamplingParams
from tests.tiny_hf import build_tiny

PAGE = 4


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = build_tiny("gemma3", tmp_path_factory.mktemp("gemma3"))
    return load_model(str(folder), "fp32", show_progress=False)


def _engine(model: LoadedModel, *, swa: bool, max_running: int = 8) -> Engine:
    engine = Engine(model, EngineConfig(page_size=PAGE, max_batch_tokens=24,
                                        kv_memory_bytes=4 << 20, max_running=max_running,
                                        check_invariants=True, swa_memory=swa, spec="none"))
    assert (engine.swa is not None) == swa
    return engine


def _run(engine: Engine, prompts: dict[str, list[int]], max_tokens: int = 12
         ) -> dict[str, Finished]:
    for rid, ids in prompts.items():
        engine.submit(Extend(rid, "t", None, ids, SamplingParams(max_tokens=max_tokens,
                                                                  ignore_eos=True)))
    return {m.request_id: m for m in engine.run_until_idle() if isinstance(m, Finished)}


def _ids(start: int, n: int) -> list[int]:
    return [(start + 37 * i) % 5000 + 10 for i in range(n)]


def _session(engine: Engine) -> list[tuple[str, list[int], int]]:
    """Agent turns, a retry of turn 2 (a fork at its prompt's end) and three concurrent
    sessions: (request id, output, cached tokens) of each."""
    out = []
    prompt = _ids(0, 30)
    for turn in range(3):
        (done,) = _run(engine, {f"turn{turn}": prompt}).values()
        out.append((done.request_id, done.output_token_ids, done.cached_len))
        if turn == 1:
            retry_prompt = prompt
        prompt = [*prompt, *done.output_token_ids, *_ids(100 * turn + 7, 9)]
    (retry,) = _run(engine, {"retry": retry_prompt}).values()
    out.append(("retry", retry.output_token_ids, retry.cached_len))
    many = _run(engine, {f"c{i}": _ids(1000 * i + 500, 20 + 7 * i) for i in range(3)},
                max_tokens=20)
    out += [(rid, d.output_token_ids, d.cached_len) for rid, d in sorted(many.items())]
    return out


def test_greedy_equals_full_length_kv(gemma: LoadedModel) -> None:
    windowed, full = _session(_engine(gemma, swa=True)), _session(_engine(gemma, swa=False))
    assert [(rid, out) for rid, out, _ in windowed] == [(rid, out) for rid, out, _ in full]
    # Turns and the retry hit as much as with full-length KV: each turn's path ends with its
    # window, and the window before a turn's prompt end is kept for its retries.
    cached = {rid: n for rid, _, n in windowed}
    assert cached == {rid: n for rid, _, n in full}
    assert cached["turn1"] >= 40 and cached["turn2"] >= 60 and cached["retry"] >= 40


def test_a_running_request_holds_only_its_window(gemma: LoadedModel) -> None:
    engine = _engine(gemma, swa=True)
    assert engine.swa is not None
    window_pages = math.ceil(8 / PAGE) + 1
    engine.submit(Extend("long", "t", None, _ids(3, 200),
                         SamplingParams(max_tokens=40, ignore_eos=True)))
    held = []
    while engine.has_work:
        engine.step()
        req = engine.scheduler.find("long")
        if req is not None:
            held.append(sum(p >= 0 for p in req.swa_page_ids))
    # The window read next, the chunk just computed, and the window before the prompt's end.
    assert max(held) <= 2 * window_pages + math.ceil(24 / PAGE)
    full_pages = math.ceil(240 / PAGE)
    assert engine.cache.num_cached_pages >= full_pages - 1
    assert engine.cache.num_cached_swa_pages <= 2 * window_pages + 1  # two windows, not 240


def test_a_lost_window_is_recomputed_and_freed_pages_are_never_read(
        gemma: LoadedModel) -> None:
    engine, reference = _engine(gemma, swa=True), _engine(gemma, swa=False)
    first = _ids(11, 33)
    for e in (engine, reference):
        (done,) = _run(e, {"a": first}).values()
        _run(e, {"b": [*first, *done.output_token_ids, 5, 6, 7, 8]})  # turn a's end: inner
    assert engine.swa is not None
    # Give back inner nodes' sliding pages (turn a's end among them), then poison every free
    # sliding page: a read of one would turn the logits to NaN.
    assert engine.cache.evict_swa(1) > 0
    free = [p for p in range(engine.swa.pool.num_pages) if engine.swa.pool.ref_count(p) == 0]
    for layer in range(gemma.model.config.num_layers):
        if gemma.model.config.is_sliding(layer):
            engine.kv_pool.k[layer][free] = float("nan")
            engine.kv_pool.v[layer][free] = float("nan")
    got = _run(engine, {"retry": first})["retry"]
    want = _run(reference, {"retry": first})["retry"]
    assert got.cached_len < want.cached_len  # the hit past the lost window is refused
    assert got.output_token_ids == want.output_token_ids
    for layer in range(gemma.model.config.num_layers):  # the NaN never reached a computation
        held = [p for p in range(engine.swa.pool.num_pages) if engine.swa.pool.ref_count(p)]
        if gemma.model.config.is_sliding(layer) and held:
            assert not torch.isnan(engine.kv_pool.k[layer][held]).any()


def test_tiers_and_the_reference_keep_full_length_kv(gemma: LoadedModel, tmp_path: Path) -> None:
    assert _engine(gemma, swa=False).kv_pool.layout.num_swa_pages == 0
    engine = Engine(gemma, EngineConfig(page_size=PAGE, kv_memory_bytes=4 << 20,
                                        host_kv_memory_bytes=1 << 20))
    assert engine.swa is None and not engine.kv_pool.layout.has_swa


def test_disaggregated_prefill_is_refused_by_name_not_by_a_crash(gemma: LoadedModel) -> None:
    # Every worker runs a KV server (serve starts one per worker): with sliding-window memory
    # it still starts, and refuses a decode worker's pairing with the reason.
    engine = _engine(gemma, swa=True)
    server = KvServer(engine, "127.0.0.1")
    sent: list[Message] = []
    assert server.intercept("decoder", KvConnect("k", kv_fingerprint(engine)),
                            lambda _origin, message: sent.append(message)) == []
    (accept,) = sent
    assert isinstance(accept, KvAccept) and "--no-swa-memory" in accept.error
    with pytest.raises(InvalidRequest, match="--no-swa-memory"):
        KvPuller(engine, ["127.0.0.1:1"], host="127.0.0.1")
