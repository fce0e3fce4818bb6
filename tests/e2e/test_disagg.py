"""Disaggregated prefill/decode with the real model and real worker processes (issue 14 points
4 and 6): greedy output equals the single-worker path, and a decode worker killed while its KV
crosses leaves the prefill worker with no page held and every structure consistent."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine.client import EngineClient
from engine.disagg.prefill_side import KvServer
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Failed, Finished, Stats
from engine.sampling_params import SamplingParams
from gateway.worker import free_port
from tests.e2e.test_scale_out import Gateway
from tests.engine.disagg.helpers import serve_in_thread, wait_until

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=16)
CONFIG = EngineConfig(kv_memory_bytes=256 << 20, page_size=16)


@contextmanager
def engine_process(*args: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "engine", "--port", str(port), "--threads", "1",
         "--kv-memory", "256", "--page-size", "16", *args])
    try:
        yield f"tcp://127.0.0.1:{port}", process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


async def stats_of(address: str, timeout_s: float = 120.0) -> Stats:
    deadline = time.monotonic() + timeout_s
    while True:
        client = await EngineClient.connect(address)
        try:
            return await client.stats(timeout_s=2.0)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
        finally:
            await client.close()


def turns(loaded: LoadedModel) -> list[tuple[str, str | None, list[int]]]:
    """Three turns of one conversation: a long first prompt, a long delta, a short one."""
    tok = loaded.tokenizer
    doc = " ".join(f"line {i}: the function f{i} returns {i * 7 % 13}." for i in range(120))
    return [("t0", None, tok.encode(f"Read this file.\n{doc}\nWhich function returns 5?")),
            ("t1", "t0", tok.encode(f"Now this one.\n{doc.replace('returns', 'yields')}\nAnd?")),
            ("t2", "t1", tok.encode("Say it again."))]


async def run_turns(address: str, conversation: list[tuple[str, str | None, list[int]]]
                    ) -> dict[str, list[int]]:
    client = await EngineClient.connect(address)
    out: dict[str, list[int]] = {}
    try:
        for request_id, parent, tokens in conversation:
            async for message in client.extend(Extend(request_id, "ns", parent, tokens, PARAMS,
                                                      bind_turn_id=request_id)):
                assert not isinstance(message, Failed), message
                if isinstance(message, Finished):
                    out[request_id] = message.output_token_ids
    finally:
        await client.close()
    return out


def single_worker(loaded: LoadedModel, conversation: list[tuple[str, str | None, list[int]]]
                  ) -> dict[str, list[int]]:
    engine = Engine(loaded, CONFIG)
    out: dict[str, list[int]] = {}
    for request_id, parent, tokens in conversation:
        engine.submit(Extend(request_id, "ns", parent, tokens, PARAMS, bind_turn_id=request_id))
        done = [m for m in engine.run_until_idle() if isinstance(m, Finished)]
        out[request_id] = done[0].output_token_ids
    return out


def test_disaggregated_greedy_output_equals_the_single_worker_path(
        loaded_model: LoadedModel) -> None:
    conversation = turns(loaded_model)
    expected = single_worker(loaded_model, conversation)
    with engine_process() as (prefill, _), engine_process(
            "--prefill-peer", prefill, "--disagg-min-tokens", "256") as (decode, _):

        async def main() -> tuple[dict[str, list[int]], Stats, Stats]:
            await stats_of(prefill)
            deadline = time.monotonic() + 60
            while (await stats_of(decode)).num_kv_peers < 1:
                assert time.monotonic() < deadline, "the KV pair did not form"
                await asyncio.sleep(0.2)
            out = await run_turns(decode, conversation)
            return out, await stats_of(prefill), await stats_of(decode)

        out, prefill_stats, decode_stats = asyncio.run(main())
    assert out == expected
    assert decode_stats.num_kv_received_pages > 0  # t0 and t1 crossed; t2 ran on the decode side
    assert prefill_stats.num_kv_sent_pages == decode_stats.num_kv_received_pages
    assert decode_stats.num_kv_fallbacks == 0 and prefill_stats.num_kv_failed_transfers == 0


def test_a_decode_worker_killed_mid_transfer_leaks_no_page(loaded_model: LoadedModel) -> None:
    prefill = Engine(loaded_model, EngineConfig(**{**CONFIG.__dict__, "check_invariants": True}))
    server = KvServer(prefill, "127.0.0.1")
    served = serve_in_thread(prefill, [server])
    tok = loaded_model.tokenizer
    long_prompt = tok.encode(" ".join(f"entry {i} is {i * i}." for i in range(400)))
    try:
        # The same KV dtype as the in-process prefill engine's fp32 model (`auto` would be
        # mixed precision's bf16 pool on a bf16 CPU, which the prefill peer rightly refuses).
        with engine_process("--prefill-peer", served.address, "--disagg-min-tokens", "256",
                            "--dtype", "fp32") as (decode, process):
            asyncio.run(stats_of(decode))
            wait_until(lambda: server.num_ready_pairs == 1, 60, "the KV pair")

            async def start_turn() -> EngineClient:
                client = await EngineClient.connect(decode)
                await client.start(Extend("long", "ns", None, long_prompt, PARAMS))
                return client

            loop = asyncio.new_event_loop()
            client = loop.run_until_complete(start_turn())
            wait_until(lambda: server.num_prefilling == 1, 60, "the PrefillFor")
            os.kill(process.pid, signal.SIGSTOP)  # it stops reading: the payload send blocks
            wait_until(lambda: server.num_prefilling == 0 and server.num_sending == 1, 120,
                       "the send to start")
            time.sleep(1.0)
            assert server.num_sending == 1, "the payload crossed although its reader stopped"
            os.kill(process.pid, signal.SIGKILL)
            wait_until(lambda: server.num_sending == 0, 60, "the send to fail")
            assert server.num_failed == 1 and server.num_sent_pages == 0
            loop.run_until_complete(client.close())
            loop.close()
        # The prefill worker still serves, and holds nothing for the dead transfer.
        again = asyncio.run(run_turns(served.address, [("after", None, long_prompt[:300])]))
        assert again["after"]
    finally:
        served.close()
    prefill.check_invariants()
    assert prefill.cache.num_locked_pages == 0
    prefill.reset_cache()
    assert prefill.page_pool.num_free_pages == prefill.page_pool.num_pages


def test_serve_with_prefill_and_decode_workers(tmp_path: Path, redis_url: str,
                                               redis_key_prefix: str) -> None:
    """`serve --prefill-workers 1 --decode-workers 1`: turns go to the decode worker, a long
    first turn's KV comes from the prefill worker, and both workers die with `serve`."""
    gateway = Gateway(tmp_path, redis_url, redis_key_prefix, "--prefill-workers", "1",
                      "--decode-workers", "1", "--disagg-min-tokens", "256")
    try:
        workers = gateway.ready(num_up=1)["workers"]
        assert len(workers) == 1  # the prefill worker is supervised, not routed to
        pids = [int(p) for p in json.loads((tmp_path / "serve.json").read_text())["engine_pids"]]
        assert len(pids) == 2
        sid = gateway.http.post("/v1/sessions", json={"system": "Be brief."}).json()["id"]
        text = " ".join(f"item {i} costs {i * 3} coins." for i in range(150))
        usage = gateway.turn(sid, f"Prices:\n{text}\nWhat does item 7 cost?")["usage"]
        # All but the last page came from the prefill worker: cached on the decode worker.
        assert usage["input_tokens"] > 1000 and usage["computed_tokens"] <= 16
        assert gateway.turn(sid, "And item 9?")["usage"]["cached_tokens"] > 1000
    finally:
        gateway.stop()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], "a worker outlived serve"
