"""Engine behaviour on a tiny random model: paged == dense, chunked prefill, sampling and stop
rules, abort, bad input, and the async client over both transports."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from engine.client import EngineClient
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Failed, Finished, Message, TokenChunk
from engine.reference import reference_generate
from engine.sampling_params import SamplingParams
from engine.scheduler.scheduler import ScheduledItem


def make_engine(loaded: LoadedModel, **overrides: object) -> Engine:
    base = {"page_size": 4, "kv_memory_bytes": 4 << 20, "max_batch_tokens": 32,
            "check_invariants": True}
    return Engine(loaded, EngineConfig(**{**base, **overrides}))  # type: ignore[arg-type]


def finished(messages: list[Message]) -> dict[str, Finished]:
    return {m.request_id: m for m in messages if isinstance(m, Finished)}


def prompt(n: int, start: int = 100) -> list[int]:
    return [start + (7 * i) % 5000 for i in range(n)]


@pytest.mark.parametrize("backend", ["torch", "torch_sdpa"])
def test_paged_chunked_equals_dense_reference(tiny: LoadedModel, backend: str) -> None:
    engine = make_engine(tiny, attention_backend=backend)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    prompts = [prompt(n, s) for n, s in ((70, 100), (3, 900), (33, 2000))]
    for i, ids in enumerate(prompts):
        engine.submit(Extend(f"r{i}", "ns", None, ids, params))
    schedule = engine.scheduler.schedule
    step_tokens: list[int] = []

    def recording_schedule() -> list[ScheduledItem]:
        items = schedule()
        step_tokens.append(sum(item.num_tokens for item in items))
        return items

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    out = engine.run_until_idle()
    # Every step kept to the 32-token budget, so the 70-token prompt was prefilled in chunks.
    assert max(step_tokens) == 32 and sum(step_tokens) == 106 + 3 * 11
    done = finished(out)
    for i, ids in enumerate(prompts):
        assert done[f"r{i}"].output_token_ids == reference_generate(tiny.model, ids, params)
    engine.reset_cache()
    assert engine.page_pool.num_free_pages == engine.page_pool.num_pages


def test_same_seed_same_sample_whatever_the_batch(tiny: LoadedModel) -> None:
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=7,
                            ignore_eos=True)
    alone = make_engine(tiny)
    alone.submit(Extend("a", "ns", None, prompt(20), params))
    crowded = make_engine(tiny)
    for i in range(4):
        crowded.submit(Extend(f"x{i}", "ns", None, prompt(15, 300 + i),
                              SamplingParams(max_tokens=16, temperature=1.0, seed=i)))
    crowded.submit(Extend("a", "ns", None, prompt(20), params))
    first = finished(alone.run_until_idle())["a"].output_token_ids
    assert first == finished(crowded.run_until_idle())["a"].output_token_ids
    assert len(set(first)) > 1


def test_stop_strings_cut_text_and_logprobs(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    params = SamplingParams(max_tokens=20, ignore_eos=True, logprobs=3)
    engine.submit(Extend("a", "ns", None, prompt(10), params))
    out = engine.run_until_idle()
    full = finished(out)["a"]
    chunks = [m for m in out if isinstance(m, TokenChunk)]
    assert all(c.logprobs and c.top_logprobs and len(c.top_logprobs[0]) == 3 for c in chunks)
    assert "".join(c.text for c in chunks) == full.text
    # Stop at a piece of the text seen above: the output ends just before it.
    stop = full.text[len(full.text) // 2:][:3]
    assert stop
    engine.submit(Extend("b", "ns", None, prompt(10), SamplingParams(
        max_tokens=20, ignore_eos=True, stop=(stop,))))
    cut = finished(engine.run_until_idle())["b"]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]


def test_abort_frees_pages_and_keeps_cached_prefix(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    engine.submit(Extend("warm", "ns", None, prompt(40), SamplingParams(max_tokens=2)))
    engine.run_until_idle()
    cached_pages = engine.cache.num_cached_pages
    engine.submit(Extend("long", "ns", None, prompt(40) + [5, 6, 7], params))
    engine.step()
    engine.step()
    out = engine.abort("long")
    assert finished(out)["long"].finish_reason == "abort"
    assert not engine.has_work
    engine.check_invariants()
    assert engine.cache.num_cached_pages == cached_pages
    assert engine.page_pool.num_used_pages == cached_pages


@pytest.mark.parametrize(("extend", "error_type"), [
    (Extend("r", "ns", "no-such-turn", [1, 2], SamplingParams()), "unknown_parent"),
    (Extend("r", "ns", None, [], SamplingParams()), "invalid_request"),
    (Extend("r", "ns", None, [10**9], SamplingParams()), "invalid_request"),
    (Extend("r", "ns", None, [1] * 4096, SamplingParams(max_tokens=8)), "request_too_long"),
])
def test_bad_requests_fail_cleanly(tiny: LoadedModel, extend: Extend, error_type: str) -> None:
    engine = make_engine(tiny)
    (failure,) = engine.submit(extend)
    assert isinstance(failure, Failed) and failure.error_type == error_type
    assert not engine.has_work


def test_turn_binding_extends_from_parent(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    engine.submit(Extend("t1", "ns", None, prompt(30), params, bind_turn_id="t1"))
    first = finished(engine.run_until_idle())["t1"]
    engine.submit(Extend("t2", "ns", "t1", [42, 43], params, bind_turn_id="t2"))
    second = finished(engine.run_until_idle())["t2"]
    path = prompt(30) + first.output_token_ids + [42, 43]
    assert second.prompt_len == len(path) and second.cached_len >= len(path) - 2 - 4
    assert second.output_token_ids == reference_generate(tiny.model, path, params)
    # Another namespace cannot extend this turn.
    (failure,) = engine.submit(Extend("t3", "other", "t1", [1], params))
    assert isinstance(failure, Failed) and failure.error_type == "unknown_parent"


async def _stream(client: EngineClient, request: Extend) -> list[Message]:
    return [m async for m in client.extend(request)]


def test_in_process_client_streams_and_aborts(tiny: LoadedModel) -> None:
    async def main() -> None:
        engine = make_engine(tiny)
        client = EngineClient.in_process(engine)
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        messages = await _stream(client, Extend("a", "ns", None, prompt(12), params))
        assert isinstance(messages[-1], Finished) and messages[-1].output_len == 8
        # Leaving the stream early aborts the request inside the engine.
        agen = client.extend(Extend("b", "ns", None, prompt(12),
                                    SamplingParams(max_tokens=2000, ignore_eos=True)))
        assert isinstance(await anext(agen), TokenChunk)
        await agen.aclose()
        for _ in range(100):
            if (await client.stats()).num_running == 0:
                break
            await asyncio.sleep(0.02)
        stats = await client.stats()
        assert stats.num_running == 0 and stats.num_waiting == 0
        await client.close()

    asyncio.run(main())


def test_zmq_worker_round_trip(tiny: LoadedModel) -> None:
    from engine.server import serve_engine_socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = make_engine(tiny)
    stop = threading.Event()
    worker = threading.Thread(target=serve_engine_socket, args=(engine, "127.0.0.1", port,
                                                                stop), daemon=True)
    worker.start()

    async def main() -> None:
        client = await EngineClient.connect(f"tcp://127.0.0.1:{port}")
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        messages = await _stream(client, Extend("z", "ns", None, prompt(9), params))
        assert isinstance(messages[-1], Finished)
        assert messages[-1].output_token_ids == reference_generate(tiny.model, prompt(9), params)
        assert (await client.stats()).num_finished == 1
        await client.close()

    try:
        asyncio.run(main())
    finally:
        stop.set()
        worker.join(timeout=10)
