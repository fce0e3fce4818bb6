"""The "cpu" backend (the C/OpenMP paged kernel for decode and verify rows) equals the plain
reference backend "torch_sdpa" on random pools: decodes, verifications and prefill chunks in
one batch, grouped heads, fp32 and bf16 KV, contexts split into several work items, pages out
of order; and greedy engine output is identical with drafting on."""

from __future__ import annotations

import random

import pytest
import torch

from engine.attention.base import PagedBatch
from engine.attention.cpu_paged import CpuPagedAttention, kernel
from engine.attention.spec import AttentionSpec
from engine.attention.torch_paged import TorchSdpaPagedAttention
from engine.config import ModelConfig
from engine.engine import Engine, EngineConfig
from engine.kv_pool import KVLayout, KVPool
from engine.models.loader import LoadedModel
from engine.protocol import Extend, Finished
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(kernel() is None, reason="the CPU kernel is not built")


def make_batch(pool: KVPool, extend_lens: list[int], context_lens: list[int],
               rng: random.Random) -> PagedBatch:
    """Each sequence gets random free pages (out of order) covering its context."""
    page_size = pool.layout.page_size
    free = list(range(pool.layout.num_pages))
    rng.shuffle(free)
    tables, slots = [], []
    for extend_len, context_len in zip(extend_lens, context_lens, strict=True):
        num_pages = -(-context_len // page_size)
        table = torch.tensor([free.pop() for _ in range(num_pages)], dtype=torch.int64)
        tables.append(table)
        positions = torch.arange(context_len - extend_len, context_len)
        slots.append(table[positions // page_size] * page_size + positions % page_size)
    return PagedBatch(extend_lens, context_lens, torch.cat(slots), tables)


def config(num_heads: int, num_kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(architecture="llama", num_layers=1, hidden_size=num_heads * head_dim,
                       intermediate_size=8, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, vocab_size=32, rope_theta=10000.0, rms_norm_eps=1e-5,
                       max_position_embeddings=8192, tie_word_embeddings=True)


@pytest.mark.parametrize(("dtype", "heads", "page_size", "split_len"), [
    (torch.float32, (9, 3, 64), 16, 256),
    (torch.float32, (4, 4, 32), 8, 40),  # no grouping; splits not aligned to pages
    (torch.float32, (8, 1, 128), 16, 16),  # one KV head, a split per page
    (torch.bfloat16, (9, 3, 64), 16, 64),
])
def test_cpu_kernel_equals_reference(dtype: torch.dtype, heads: tuple[int, int, int],
                                     page_size: int, split_len: int,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CpuPagedAttention, "split_len", split_len)
    # Verification rows through the kernel too (the engine sends it decodes only, for speed).
    monkeypatch.setattr(CpuPagedAttention, "max_kernel_rows", 16)
    rng = random.Random(7)
    num_heads, num_kv_heads, head_dim = heads
    cfg = config(num_heads, num_kv_heads, head_dim)
    pool = KVPool(cfg, KVLayout(num_pages=2048, page_size=page_size, bytes_per_page=0), dtype)
    # Fill every slot (cached prefixes) with random K/V.
    pool.k[0].normal_()
    pool.v[0].normal_()
    # Decodes (1 row), verifications (1 + k rows), a prefill chunk (40 rows), tiny contexts.
    extend_lens = [1, 5, 1, 40, 9, 1, 16, 17]
    context_lens = [1, 700, 1301, 300, 9, 2, 4000, 17]
    for trial in range(3):
        batch = make_batch(pool, extend_lens, context_lens, rng)
        num_rows = sum(extend_lens)
        q = torch.randn(num_rows, num_heads, head_dim).to(dtype)
        k = torch.randn(num_rows, num_kv_heads, head_dim).to(dtype)
        v = torch.randn(num_rows, num_kv_heads, head_dim).to(dtype)
        got = CpuPagedAttention(pool, batch)(AttentionSpec.plain(0, head_dim), q, k, v)
        want = TorchSdpaPagedAttention(pool, batch)(AttentionSpec.plain(0, head_dim), q, k, v)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol,
                                   msg=f"trial {trial}")
        # Only decode/verify rows at once (the path without a gather of query rows).
        short = [i for i, n in enumerate(extend_lens) if n <= 16]
        sub = make_batch(pool, [extend_lens[i] for i in short],
                         [context_lens[i] for i in short], rng)
        rows = sum(sub.extend_lens)
        spec = AttentionSpec.plain(0, head_dim)
        got = CpuPagedAttention(pool, sub)(spec, q[:rows], k[:rows], v[:rows])
        want = TorchSdpaPagedAttention(pool, sub)(spec, q[:rows], k[:rows], v[:rows])
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize(("dtype", "pool_dtype"), [(torch.float32, torch.float32),
                                                   (torch.bfloat16, torch.bfloat16),
                                                   (torch.float32, torch.bfloat16)])
def test_kernel_stores_strided_rows_of_a_fused_qkv(dtype: torch.dtype,
                                                   pool_dtype: torch.dtype) -> None:
    """q, k and v as views of one fused qkv row (the packed forward's layout): the kernel
    writes k/v into the pool and reads q in place, as the reference does after copies. fp32
    rows into a bf16 pool (a mixed-precision decode) are rounded as torch rounds them."""
    rng = random.Random(3)
    cfg = config(9, 3, 64)
    layout = KVLayout(num_pages=256, page_size=16, bytes_per_page=0)
    pool, ref_pool = KVPool(cfg, layout, pool_dtype), KVPool(cfg, layout, pool_dtype)
    pool.k[0].normal_()
    pool.v[0].normal_()
    ref_pool.k[0].copy_(pool.k[0])
    ref_pool.v[0].copy_(pool.v[0])
    batch = make_batch(pool, [1, 9, 1], [100, 300, 17], rng)
    qkv = torch.randn(11, cfg.q_size + 2 * cfg.kv_size).to(dtype)
    q, k, v = torch.split(qkv, [cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
    q, k, v = q.view(11, 9, 64), k.view(11, 3, 64), v.view(11, 3, 64)
    spec = AttentionSpec.plain(0, 64)
    got = CpuPagedAttention(pool, batch)(spec, q, k, v)
    want = TorchSdpaPagedAttention(ref_pool, batch)(spec, q.contiguous(), k.contiguous(),
                                                     v.contiguous())
    tol = 1e-5 if pool_dtype == torch.float32 else 2e-2
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    assert torch.equal(pool.k[0], ref_pool.k[0]) and torch.equal(pool.v[0], ref_pool.v[0])


@pytest.mark.parametrize("max_kernel_rows", [1, 16])
def test_cpu_backend_greedy_equals_reference_with_drafting(
        tiny: LoadedModel, max_kernel_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole engine, drafting on, against torch_sdpa: decodes through the kernel (as the engine
    runs it), and verification rows through it too."""
    monkeypatch.setattr(CpuPagedAttention, "max_kernel_rows", max_kernel_rows)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    prompts = [tiny.tokenizer.encode(t) for t in (
        "def add(a, b):\n    return a + b\n\ndef add(a, b):\n" * 2,
        "one two three four five one two three", "x" * 300)]
    outputs = {}
    for backend in ("torch_sdpa", "cpu"):
        engine = Engine(tiny, EngineConfig(page_size=4, kv_memory_bytes=8 << 20,
                                           max_batch_tokens=64, check_invariants=True,
                                           attention_backend=backend, spec="suffix"))
        for _ in range(2):  # the second pass drafts from the first's session corpus
            for i, ids in enumerate(prompts):
                engine.submit(Extend(f"r{i}", "ns", None, ids, params, session_id="s"))
            done = {m.request_id: m for m in engine.run_until_idle() if isinstance(m, Finished)}
        outputs[backend] = {rid: m.output_token_ids for rid, m in done.items()}
        assert sum(m.num_accepted for m in done.values()) > 0
    assert outputs["cpu"] == outputs["torch_sdpa"]
