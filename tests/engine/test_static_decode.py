"""The static-buffer decode path (`engine.cuda_graph`) generates what the normal path does.

On the CPU it runs eagerly, its Triton kernels under the interpreter; graph capture is CUDA only
and must be skipped cleanly here. The CUDA tests need compiled kernels (TRITON_INTERPRET=0):
interpreted kernels cannot be captured.
"""

from __future__ import annotations

import os

# As tests/engine/attention/conftest.py: before triton is first imported, respecting a set value.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="triton is not installed")

from engine.attention.base import PagedBatch  # noqa: E402
from engine.attention.triton_kernels import store_kv  # noqa: E402
from engine.cuda_graph import StaticDecode, graph_batch_sizes, make_static_decode  # noqa: E402
from engine.engine import Engine, EngineConfig  # noqa: E402
from engine.errors import InvalidRequest  # noqa: E402
from engine.kv_pool import KVLayout, KVPool  # noqa: E402
from engine.models.loader import LoadedModel, place_model  # noqa: E402
from engine.protocol import Extend, Finished  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_interpreter = pytest.mark.skipif(not INTERPRETED,
                                       reason="CPU kernels need TRITON_INTERPRET=1")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                                reason="needs CUDA and compiled kernels (TRITON_INTERPRET=0)")

# Three sequences that finish at different steps, so decode batches of 3, 2 and 1 run padded to
# graph sizes 4, 2 and 1; a 16-token budget mixes prefill chunks (eager) with decodes (static).
PROMPTS = [[100 + (7 * i) % 500 for i in range(n)] for n in (11, 3, 6)]
MAX_TOKENS = (8, 5, 3)
CONFIG = {"page_size": 4, "kv_memory_bytes": 256 << 10, "max_running": 4,
          "max_batch_tokens": 16, "spec": "none", "check_invariants": True}


def generate(engine: Engine) -> dict[str, list[int]]:
    for i, (ids, max_tokens) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        engine.submit(Extend(f"r{i}", "ns", None, ids, params))
    out = engine.run_until_idle()
    return {m.request_id: m.output_token_ids for m in out if isinstance(m, Finished)}


def engine_for(loaded: LoadedModel, **overrides: object) -> Engine:
    return Engine(loaded, EngineConfig(**{**CONFIG, **overrides}))  # type: ignore[arg-type]


def test_graph_batch_sizes() -> None:
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(32) == [1, 2, 4, 8, 16, 32]
    assert graph_batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    with pytest.raises(InvalidRequest):
        graph_batch_sizes(0)


@needs_interpreter
def test_static_decode_equals_torch_path(tiny: LoadedModel) -> None:
    want = generate(engine_for(tiny))
    engine = engine_for(tiny)
    static = StaticDecode(engine.runner.model, engine.kv_pool, graph_batch_sizes(4),
                          capture=False)
    engine.runner.static_decode = static
    sizes: list[int] = []
    forward = static.forward

    def recording_forward(input_ids: torch.Tensor, positions: torch.Tensor,
                          batch: PagedBatch) -> torch.Tensor:
        sizes.append(input_ids.shape[0])
        return forward(input_ids, positions, batch)

    static.forward = recording_forward  # type: ignore[method-assign]
    assert generate(engine) == want
    # Steps 1-2 mix prefill chunks with decodes (eager); every later step is a pure decode.
    assert sizes == [3, 3, 2, 1, 1, 1] and static.num_steps == 6 and not static.graphs


@needs_interpreter
def test_store_kv_skips_negative_slots(tiny: LoadedModel) -> None:
    cfg = tiny.model.config
    pool = KVPool(cfg, KVLayout(num_pages=2, page_size=4, bytes_per_page=0), torch.float32)
    k = torch.randn(2, cfg.num_kv_heads, cfg.head_dim)
    v = torch.randn(2, cfg.num_kv_heads, cfg.head_dim)
    store_kv(k, v, pool.k[0], pool.v[0], torch.tensor([5, -1]))
    flat_k, flat_v = pool.flat_k(0), pool.flat_v(0)
    assert torch.equal(flat_k[5], k[0]) and torch.equal(flat_v[5], v[0])
    others = [slot for slot in range(8) if slot != 5]
    assert not flat_k[others].any() and not flat_v[others].any()


@needs_interpreter
def test_accepts_only_fitting_decode_batches(tiny: LoadedModel) -> None:
    engine = engine_for(tiny)
    static = StaticDecode(tiny.model, engine.kv_pool, [1, 2], capture=False)

    def batch(extend_lens: list[int], context_lens: list[int]) -> PagedBatch:
        tables = [torch.zeros(-(-n // 4), dtype=torch.long) for n in context_lens]
        return PagedBatch(extend_lens, context_lens, torch.zeros(sum(extend_lens)), tables)

    assert static.accepts(batch([1, 1], [5, 9]))
    assert not static.accepts(batch([1, 1, 1], [5, 9, 2]))  # larger than the largest size
    assert not static.accepts(batch([1, 2], [5, 9]))  # a prefill chunk or a draft
    assert not static.accepts(batch([1], [static.max_context_len + 1]))


def test_capture_is_skipped_on_cpu(tiny: LoadedModel) -> None:
    engine = engine_for(tiny, cuda_graphs=True)
    assert engine.runner.static_decode is None
    assert make_static_decode(tiny.model, engine.kv_pool, "triton", 4, True) is None
    with pytest.raises(InvalidRequest, match="CUDA graphs need a CUDA device"):
        StaticDecode(tiny.model, engine.kv_pool, [1], capture=True)


def test_place_model_on_cpu_keeps_the_model(tiny: LoadedModel) -> None:
    assert place_model(tiny, "cpu") is tiny
    moved = tiny.model.to("cpu")
    assert moved.weights.lm_head is moved.weights.embed  # tied weights stay one tensor
    with pytest.raises(InvalidRequest):
        place_model(tiny, "tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_device_without_cuda_is_a_clear_error(tiny: LoadedModel) -> None:
    with pytest.raises(InvalidRequest, match="CUDA is not available"):
        engine_for(tiny, device="cuda")


@needs_cuda
def test_cuda_graphs_equal_eager_decode(tiny: LoadedModel) -> None:
    eager = engine_for(tiny, device="cuda", attention_backend="triton", cuda_graphs=False)
    assert eager.runner.static_decode is None
    want = generate(eager)
    engine = engine_for(tiny, device="cuda", attention_backend="triton")
    static = engine.runner.static_decode
    assert static is not None and sorted(static.graphs) == [1, 2, 4]
    assert engine.kv_pool.k[0].is_cuda and engine.loaded.model.device.type == "cuda"
    assert generate(engine) == want
    assert static.num_steps == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_fallback_on_cuda_equals_cpu(tiny: LoadedModel) -> None:
    want = generate(engine_for(tiny))
    engine = engine_for(tiny, device="cuda", attention_backend="torch")
    assert engine.runner.static_decode is None  # the reference runs every step as it is
    assert generate(engine) == want
