"""The C extend attention kernel (engine.attention.cpu_extend.paged_extend) against the plain
references: transformers-style eager attention in fp64 over random pools with pages out of
order (prefills from position 0, chunks after a cached prefix, many sequences in one call,
grouped heads of 32/64/80/128 dims, windows and sinks), torch_sdpa through the "cpu" backend
with decodes and verifications in the same batch, and greedy engine output.

Each kernel test runs on five builds of the source: the installed one (-march=native: AMX tiles
for a bf16 pool on a Xeon that has them), one for Cooper Lake (AVX512-BF16 dot products without
AMX, as Zen 4 runs it), one for Ice Lake (AVX-512 without bf16: fp32 FMAs, a bf16 pool
widened), one for x86-64-v3 (AVX2, as Zen 3 runs it) and one for x86-64-v2 (the portable C).
A build this CPU cannot run is skipped."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from engine.attention import cpu_extend, cpu_paged
from engine.attention.cpu_extend import extend_choice, paged_extend
from engine.attention.cpu_paged import CpuPagedAttention
from engine.attention.spec import AttentionSpec
from engine.attention.torch_paged import TorchSdpaPagedAttention
from engine.engine import Engine, EngineConfig
from engine.errors import InvalidRequest
from engine.kv_pool import KVLayout, KVPool
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams
from tests.engine.attention.kernel_builds import ROOT, use_build
from tests.engine.attention.test_cpu_paged import config, make_batch
from tests.engine.attention.test_cpu_paged_spec import Batch

SOURCE = ROOT / "engine/attention/csrc/extend_cpu.c"
BUILDS = ("native", "cooperlake", "icelake-server", "x86-64-v3", "x86-64-v2")
# A prefill from 0, chunks after cached prefixes (tiles cut mid-page and mid-tile), a long
# delta, single-token and tiny contexts.
SEQS = [(40, 40), (100, 700), (33, 1301), (257, 3000), (17, 17), (1, 65), (64, 192)]


@pytest.fixture(params=BUILDS)
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Routes paged_extend to one build of the kernel."""
    return use_build(str(request.param), cpu_extend, SOURCE, monkeypatch)


class ExtendBatch(Batch):
    """`Batch`'s sequences through the extend kernel."""

    def run(self, split_len: int = 256, **options: Any) -> torch.Tensor:
        head_dim = self.q.shape[2]
        pages = torch.cat(self.tables).contiguous()
        page_starts = torch.tensor([0, *[len(t) for t in self.tables]][:-1],
                                   dtype=torch.int64).cumsum(0)
        extend_lens = self.row_starts[1:] - self.row_starts[:-1]
        out = torch.full(self.q.shape, float("nan"))
        scale = options.pop("scale", None)
        paged_extend(self.q.float(), self.k, self.v, pages, page_starts, self.context_lens,
                     self.row_starts[:-1].contiguous(), extend_lens, self.page_size, out,
                     scale=head_dim**-0.5 if scale is None else scale, split_len=split_len,
                     **options)
        return out.to(self.q.dtype)


def tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 2e-2


@pytest.mark.parametrize(("dtype", "heads", "page_size", "window", "sink", "scale"), [
    (torch.float32, (9, 3, 64), 16, None, False, None),  # SmolLM2's heads
    (torch.float32, (9, 3, 64), 16, None, True, 0.3),
    (torch.float32, (8, 1, 128), 16, 300, True, 0.05),
    (torch.float32, (4, 4, 32), 8, 1, False, None),  # each row sees itself only
    (torch.float32, (8, 2, 80), 16, 100, False, None),  # 80 dims: not a multiple of 16
    (torch.float32, (16, 2, 64), 16, 5000, True, None),  # 8 heads a group; window past all
    (torch.bfloat16, (9, 3, 64), 16, None, False, None),
    (torch.bfloat16, (9, 3, 64), 8, 128, True, None),
    (torch.bfloat16, (8, 1, 128), 16, 17, True, 0.2),
    (torch.bfloat16, (4, 2, 40), 16, None, False, None),  # 40 dims: a pair tail in the pack
])
def test_extend_matches_reference(build: str, dtype: torch.dtype, heads: tuple[int, int, int],
                                  page_size: int, window: int | None, sink: bool,
                                  scale: float | None) -> None:
    gen = torch.Generator().manual_seed(0)
    batch = ExtendBatch(SEQS, heads, page_size, dtype, gen)
    sinks = 2 * torch.randn(heads[0], generator=gen) if sink else None
    if window is not None:
        # The pages before every row's window are not read: garbage there changes nothing.
        batch.poison_before_windows(window)
    got = batch.run(scale=scale, window=window, sinks=sinks)
    want = batch.reference(scale, window, sinks)
    assert torch.isfinite(got).all()
    tol = tolerance(dtype)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pages_before_the_window_are_never_read(build: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    window = 40
    batch = ExtendBatch([(30, 4000), (100, 3000), (50, 1000)], (9, 3, 64), 16, dtype, gen)
    batch.invalidate_before_windows(window)
    got = batch.run(window=window)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), batch.reference(None, window).float(),
                               atol=tolerance(dtype), rtol=tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_its_chunk(build: str, dtype: torch.dtype) -> None:
    """Prefill chunked three ways (one extend, three chunks, chunks beside another sequence)
    gives every row the same bits: its lanes are its own and the key tiles sit on a grid of
    absolute positions, whatever block or item it fell in."""
    gen = torch.Generator().manual_seed(9)
    whole = ExtendBatch([(200, 1000)], (9, 3, 64), 16, dtype, gen)
    sinks = torch.randn(9, generator=gen)
    want = whole.run(window=300, sinks=sinks)
    for cuts in ([0, 37, 100, 200], [0, 1, 17, 200], [0, 150, 200]):
        pieces = []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            piece = ExtendBatch([(1, 1)], (9, 3, 64), 16, dtype, gen)
            piece.k, piece.v, piece.tables = whole.k, whole.v, whole.tables
            piece.q = whole.q[lo:hi]
            piece.row_starts = torch.tensor([0, hi - lo])
            piece.context_lens = torch.tensor([1000 - 200 + hi])
            pieces.append(piece.run(window=300, sinks=sinks))
        assert torch.equal(torch.cat(pieces), want), cuts


def test_rows_of_other_sequences_are_not_written(build: str) -> None:
    """Sequence s owns rows [row_starts[s], + extend_lens[s]); rows between them (the short
    sequences the decode kernel takes) are left as they were."""
    gen = torch.Generator().manual_seed(3)
    batch = ExtendBatch([(20, 100), (30, 300)], (4, 2, 32), 16, torch.float32, gen)
    q = torch.randn(60, 4, 32, generator=gen)
    q[5:25], q[30:60] = batch.q[:20], batch.q[20:]
    out = torch.full((60, 4, 32), 7.0)
    pages = torch.cat(batch.tables).contiguous()
    paged_extend(q, batch.k, batch.v, pages, torch.tensor([0, len(batch.tables[0])]),
                 batch.context_lens, torch.tensor([5, 30]), torch.tensor([20, 30]), 16, out,
                 scale=32**-0.5)
    want = batch.reference()
    torch.testing.assert_close(out[5:25], want[:20], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[30:], want[20:], atol=1e-5, rtol=1e-5)
    assert (out[:5] == 7).all() and (out[25:30] == 7).all()


@pytest.fixture
def c_extends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The "cpu" backend sends long extends to the C kernel whatever the table says."""
    monkeypatch.setattr(cpu_paged, "extend_choice", lambda dtype, head_dim: ("c", "test"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_backend_with_c_extends_equals_torch_sdpa(c_extends: None, dtype: torch.dtype) -> None:
    """Decodes, verifications and long extends in one batch, pages shuffled: the extend kernel
    writes its rows, the decode kernel the short ones."""
    import random

    rng = random.Random(7)
    cfg = config(9, 3, 64)
    pool = KVPool(cfg, KVLayout(num_pages=1024, page_size=16, bytes_per_page=0), dtype)
    pool.k[0].normal_()
    pool.v[0].normal_()
    extend_lens = [1, 40, 5, 300, 1, 17, 64]
    context_lens = [900, 40, 700, 2000, 3, 4017, 64]
    batch = make_batch(pool, extend_lens, context_lens, rng)
    rows = sum(extend_lens)
    q = torch.randn(rows, 9, 64).to(dtype)
    k = torch.randn(rows, 3, 64).to(dtype)
    v = torch.randn(rows, 3, 64).to(dtype)
    spec = AttentionSpec.plain(0, 64)
    backend = CpuPagedAttention(pool, batch)
    assert backend.extend_index is not None
    got = backend(spec, q, k, v)
    want = TorchSdpaPagedAttention(pool, batch)(spec, q, k, v)
    assert got.dtype == dtype
    tol = tolerance(dtype)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_greedy_engine_output_equals_reference(tiny: LoadedModel, c_extends: None) -> None:
    """Whole engine, chunked prefills over cached prefixes (the second pass reuses the first's
    cache), against torch_sdpa."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = [tiny.tokenizer.encode(t) for t in (
        "def add(a, b):\n    return a + b\n\n" * 6, "one two three four five " * 20, "x" * 300)]
    outputs = {}
    for backend in ("torch_sdpa", "cpu"):
        engine = Engine(tiny, EngineConfig(page_size=4, kv_memory_bytes=8 << 20,
                                           max_batch_tokens=64, check_invariants=True,
                                           attention_backend=backend))
        for turn in range(2):
            for i, ids in enumerate(prompts):
                engine.submit(Extend(f"r{turn}{i}", "ns", None, ids + [7] * turn, params))
            done = {m.request_id: m for m in engine.run_until_idle() if isinstance(m, Finished)}
        outputs[backend] = {rid: m.output_token_ids for rid, m in done.items()}
        assert sum(m.cached_len for m in done.values()) > 0
    assert outputs["cpu"] == outputs["torch_sdpa"]


def test_choice_is_logged_and_can_be_overridden(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    if cpu_extend.kernel() is None:
        pytest.skip("the extend kernel is not built")
    extend_choice.cache_clear()
    monkeypatch.setenv(cpu_extend.CHOICE_ENV, "torch")
    with caplog.at_level(logging.INFO, logger="engine.attention.cpu_extend"):
        assert extend_choice(torch.float32, 64) == ("torch", f"{cpu_extend.CHOICE_ENV}=torch")
    assert "extend attention over a float32 pool, head_dim 64: torch flash" in caplog.text
    extend_choice.cache_clear()
    monkeypatch.setenv(cpu_extend.CHOICE_ENV, "c")
    assert extend_choice(torch.bfloat16, 64)[0] == "c"
    assert extend_choice(torch.bfloat16, 60) == ("torch", "head_dim 60 is not a multiple of 8")
    extend_choice.cache_clear()
    monkeypatch.setenv(cpu_extend.CHOICE_ENV, "amx")
    # Where the build has no AMX tiles (or the pool is fp32), "amx" is the C kernel's own path.
    assert extend_choice(torch.float32, 64)[0] == "c"
    extend_choice.cache_clear()
    monkeypatch.setenv(cpu_extend.CHOICE_ENV, "fast")
    with pytest.raises(InvalidRequest, match="use c, amx, torch or auto"):
        extend_choice(torch.float32, 64)
    extend_choice.cache_clear()


@pytest.mark.parametrize(("simd", "dtype", "head_dim", "path"), [
    ("amx", torch.bfloat16, 64, "amx"),  # AMX tiles: faster, not a decode's bits
    ("amx", torch.bfloat16, 80, "torch"),  # AMX needs 32 dims a step; dpbf16 is slower here
    ("amx", torch.float32, 80, "c"),
    ("avx512_bf16", torch.bfloat16, 64, "c"),
    ("avx512", torch.bfloat16, 64, "c"),
    ("avx2", torch.float32, 128, "c"),
    ("portable", torch.float32, 64, "torch"),
])
def test_table_by_build_dtype_and_head_dim(simd: str, dtype: torch.dtype, head_dim: int,
                                           path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    class Build:
        @staticmethod
        def simd() -> str:
            return simd

    monkeypatch.delenv(cpu_extend.CHOICE_ENV, raising=False)
    monkeypatch.setattr(cpu_extend, "kernel", lambda: Build)
    extend_choice.cache_clear()
    try:
        assert extend_choice(dtype, head_dim)[0] == path
    finally:
        extend_choice.cache_clear()


def test_bad_arguments_are_refused() -> None:
    if cpu_extend.kernel() is None:
        pytest.skip("the extend kernel is not built")
    pool = torch.zeros(64, 2, 32)
    index = (torch.tensor([0, 1, 2, 3]), torch.tensor([0]), torch.tensor([50]),
             torch.tensor([0]), torch.tensor([50]))
    out = torch.empty(50, 4, 32)
    with pytest.raises(ValueError, match="fp32, dims dense"):
        paged_extend(torch.zeros(50, 4, 32, dtype=torch.bfloat16), pool, pool, *index, 16, out,
                     scale=1.0)
    with pytest.raises(ValueError, match="an entry per sequence"):
        paged_extend(torch.zeros(50, 4, 32), pool, pool, index[0], index[1], index[2],
                     index[3], torch.tensor([50, 1]), 16, out, scale=1.0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        paged_extend(torch.zeros(50, 4, 32), pool, pool, *index, 16, out, scale=1.0, window=0)
    with pytest.raises(TypeError):
        paged_extend(torch.zeros(50, 4, 32), pool, pool, index[0].int(), index[1], index[2],
                     index[3], index[4], 16, out, scale=1.0)
