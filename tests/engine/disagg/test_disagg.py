"""Disaggregated prefill/decode (issue 14 point 4): greedy output of a decode worker that has its
long deltas prefilled by a peer equals the single-worker path, pages really crossed, and every
structure on both sides stays consistent."""

from __future__ import annotations

import asyncio

from engine.client import EngineClient
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams
from tests.engine.disagg.helpers import disagg_pair
from tests.engine.test_engine_core import finished, make_engine, prompt

PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)


def conversation() -> list[tuple[str, str | None, list[int]]]:
    """(request id, parent turn, tokens): two sessions, 3 turns each; turn deltas are long
    (prefilled by the peer) or short (computed by the decode worker itself)."""
    turns: list[tuple[str, str | None, list[int]]] = []
    for s in range(2):
        turns.append((f"s{s}t0", None, prompt(70, 100 + 900 * s)))
        turns.append((f"s{s}t1", f"s{s}t0", prompt(45, 3000 + 100 * s)))
        turns.append((f"s{s}t2", f"s{s}t1", prompt(5, 4000 + 100 * s)))
    return turns


def single_worker(loaded: LoadedModel) -> dict[str, list[int]]:
    engine = make_engine(loaded)
    out: dict[str, list[int]] = {}
    for request_id, parent, tokens in conversation():
        engine.submit(Extend(request_id, "ns", parent, tokens, PARAMS, bind_turn_id=request_id))
        out[request_id] = finished(engine.run_until_idle())[request_id].output_token_ids
    return out


async def _run(address: str) -> dict[str, Finished]:
    client = await EngineClient.connect(address)
    done: dict[str, Finished] = {}
    try:
        for request_id, parent, tokens in conversation():
            async for message in client.extend(Extend(request_id, "ns", parent, tokens, PARAMS,
                                                      bind_turn_id=request_id)):
                assert not hasattr(message, "error_type"), message
                if isinstance(message, Finished):
                    done[request_id] = message
    finally:
        await client.close()
    return done


def test_disaggregated_greedy_output_equals_the_single_worker_path(tiny: LoadedModel) -> None:
    expected = single_worker(tiny)
    prefill, decode = make_engine(tiny), make_engine(tiny)
    with disagg_pair(prefill, decode, min_tokens=16) as (_, decode_served, server, puller):
        done = asyncio.run(_run(decode_served.address))
        assert {k: v.output_token_ids for k, v in done.items()} == expected
        # Turns 0 and 1 (70 and 45 new tokens) crossed; turn 2 (5 new) ran on the decode worker.
        inbox = puller.inbox
        assert inbox.num_received > 0 and inbox.num_loaded == inbox.num_received
        assert server.num_sent_pages == puller.inbox.num_received
        assert puller.num_fallbacks == 0 and server.num_failed == 0
        # A first turn's 17 whole pages (all but its last token's) came from the peer; turn 1
        # needed pages 19..29 (its parent's 78 tokens were cached here): 2 x (17 + 11) pages.
        assert done["s0t0"].cached_len == 68 and server.num_sent_pages == 56
        assert len(puller.inbox) == 0
    for engine in (prefill, decode):
        engine.check_invariants()
        engine.reset_cache()
        assert engine.page_pool.num_free_pages == engine.page_pool.num_pages


def test_a_transfer_that_never_lands_is_recomputed_by_the_decode_worker(
        tiny: LoadedModel) -> None:
    expected = single_worker(tiny)
    prefill, decode = make_engine(tiny), make_engine(tiny)
    with disagg_pair(prefill, decode, min_tokens=16, deadline_s=0.5) as (
            prefill_served, decode_served, server, puller):
        prefill_served.close()  # formed, then silent: no PrefillFor is ever answered
        done = asyncio.run(_run(decode_served.address))
        assert {k: v.output_token_ids for k, v in done.items()} == expected
        # The first long turn waited out its deadline; that broke the pair, the peer never
        # answered the new KvConnect, and the other long turns ran here without waiting.
        assert puller.num_fallbacks == 1 and puller.inbox.num_received == 0
        assert puller.stats()["num_kv_peers"] == 0
        assert server.num_sent_pages == 0
    decode.check_invariants()
    decode.reset_cache()
    assert decode.page_pool.num_free_pages == decode.page_pool.num_pages
