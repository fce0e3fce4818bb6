"""One GPU check of the paged-attention kernels and an 8B-shaped model (see gpu_check.sh).

    python benchmarks/gpu_check.py --out DIR [--dry-run]

Sections: kernel correctness vs the torch reference backend (relative error per dtype), decode
bandwidth vs a device copy, extend TFLOP/s vs torch SDPA (and flash-attn if it imports), then an
8B-shaped random-weight Llama: TTFT of a 512-token delta at 4k-64k context cached vs uncached,
and decode tokens/s at batch 1/16/64 with CUDA graphs off (the eager step) and on (the engine's
`StaticDecode` replay). `--dry-run`: CPU, tiny shapes, Triton interpreter, no
timing. Writes results.json and table.txt under --out; prints the table last.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
ARGS.add_argument("--dry-run", action="store_true")
ARGS.add_argument("--budget-s", type=float, default=450.0, help="skip sections past this")
OPTS = ARGS.parse_args()
if OPTS.dry_run:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from engine.attention.base import PagedBatch  # noqa: E402
from engine.attention.spec import AttentionSpec  # noqa: E402
from engine.attention.torch_paged import TorchPagedAttention  # noqa: E402
from engine.attention.triton_backend import TritonPagedAttention  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.cuda_graph import StaticDecode  # noqa: E402
from engine.kv_pool import KVLayout, KVPool  # noqa: E402
from engine.models.decoder import DecoderModel  # noqa: E402
from engine.models.weights import LayerWeights, ModelWeights  # noqa: E402

DRY = OPTS.dry_run
DEV = "cpu" if DRY else "cuda"
START = time.perf_counter()
ROWS: list[tuple[str, str, str]] = []  # (section, case, value) for the final table
RESULTS: dict[str, Any] = {"dry_run": DRY, "device": "cpu" if DRY else torch.cuda.get_device_name()}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


def record(section: str, case: str, value: str, **data: Any) -> None:
    ROWS.append((section, case, value))
    RESULTS.setdefault(section, []).append({"case": case, **data})
    log(f"{section} | {case} | {value}")


def timed(fn: Callable[[], object], reps: int = 10) -> float | None:
    """Median seconds per call (None in a dry run: one call, untimed)."""
    fn()
    if DRY:
        return None
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def config(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int,
           vocab: int, max_pos: int) -> ModelConfig:
    return ModelConfig(architecture="llama", num_layers=layers, hidden_size=hidden,
                       intermediate_size=inter, num_heads=heads, num_kv_heads=kv_heads,
                       head_dim=head_dim, vocab_size=vocab, rope_theta=500000.0,
                       rms_norm_eps=1e-5, max_position_embeddings=max_pos,
                       tie_word_embeddings=False)


def make_pool(cfg: ModelConfig, num_tokens: int, page_size: int, dtype: torch.dtype) -> KVPool:
    layout = KVLayout(-(-num_tokens // page_size) + 1, page_size, 0)
    return KVPool(cfg, layout, dtype, device=DEV)


def make_batch(extend_lens: list[int], context_lens: list[int], page_size: int) -> PagedBatch:
    """Sequences laid out on consecutive pages; the rows of this step are the last of each."""
    tables, slots, page = [], [], 0
    for ext, ctx in zip(extend_lens, context_lens, strict=True):
        n = -(-ctx // page_size)
        table = torch.arange(page, page + n)
        page += n
        tables.append(table)
        pos = torch.arange(ctx - ext, ctx)
        slots.append(table[pos // page_size] * page_size + pos % page_size)
    return PagedBatch(extend_lens, context_lens, torch.cat(slots), tables)


def attn_case(cfg: ModelConfig, extend_lens: list[int], context_lens: list[int], page_size: int,
              dtype: torch.dtype) -> tuple[KVPool, PagedBatch, tuple[torch.Tensor, ...]]:
    pool = make_pool(cfg, sum(context_lens), page_size, dtype)
    for t in (pool.k[0], pool.v[0]):
        t.normal_()
    n = sum(extend_lens)
    qkv = [torch.randn(n, h, cfg.head_dim, device=DEV, dtype=dtype)
           for h in (cfg.num_heads, cfg.num_kv_heads, cfg.num_kv_heads)]
    return pool, make_batch(extend_lens, context_lens, page_size), tuple(qkv)


def check_correctness() -> None:
    cfg = config(1, 0, 8, 2, 64 if DRY else 128, 0, 0, 0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for name, ext, ctx in (("decode", [1, 1, 1], [1, 300, 200 if DRY else 1500]),
                               ("extend", [37, 70], [37, 100 if DRY else 3000])):
            pool, batch, (q, k, v) = attn_case(cfg, ext, ctx, 16, dtype)
            spec = AttentionSpec.plain(0, cfg.head_dim)
            out = TritonPagedAttention(pool, batch)(spec, q, k, v).float().cpu()
            ref_pool = make_pool(cfg, sum(ctx), 16, torch.float32)
            ref_pool.k = [pool.k[0].float().cpu()]
            ref_pool.v = [pool.v[0].float().cpu()]
            ref = TorchPagedAttention(ref_pool, batch)(spec, q.float().cpu(), k.float().cpu(),
                                                       v.float().cpu())
            rel = ((out - ref).norm() / ref.norm()).item()
            ok = rel < (1e-4 if dtype == torch.float32 else 2e-2)
            record("correctness", f"{name} {str(dtype)[6:]}", f"rel err {rel:.2e} "
                   f"{'ok' if ok else 'FAIL'}", rel_err=rel, ok=ok)


def check_decode_bandwidth() -> None:
    cfg = config(1, 0, 32, 8, 128, 0, 0, 0)
    nbytes = 1 << (20 if DRY else 30)
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src))
    copy_gbs = 2 * nbytes / t / 1e9 if t else None
    record("decode_bw", "device copy", f"{copy_gbs:.0f} GB/s" if copy_gbs else "dry", gbs=copy_gbs)
    cases = [(1, 64), (4, 32)] if DRY else [(1, 32768), (16, 4096), (64, 2048), (64, 8192)]
    for batch_size, ctx in cases:
        pool, batch, (q, k, v) = attn_case(cfg, [1] * batch_size, [ctx] * batch_size, 16,
                                           torch.bfloat16)
        backend = TritonPagedAttention(pool, batch)
        spec = AttentionSpec.plain(0, cfg.head_dim)
        t = timed(functools.partial(backend, spec, q, k, v), reps=20)
        kv_bytes = 2 * batch_size * ctx * cfg.num_kv_heads * cfg.head_dim * 2
        gbs = kv_bytes / t / 1e9 if t else None
        value = (f"{gbs:.0f} GB/s ({100 * gbs / copy_gbs:.0f}% of copy), {t * 1e6:.0f} us"
                 if gbs and copy_gbs and t else "dry")
        record("decode_bw", f"B={batch_size} ctx={ctx}", value, gbs=gbs, seconds=t)


def check_extend_flops() -> None:
    cfg = config(1, 0, 32, 8, 128 if not DRY else 64, 0, 0, 0)
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        flash_attn_func = None
    cases = [(40, 40), (16, 80)] if DRY else [(4096, 4096), (8192, 8192), (512, 16384 + 512)]
    for ext, ctx in cases:
        pool, batch, (q, k, v) = attn_case(cfg, [ext], [ctx], 16, torch.bfloat16)
        backend = TritonPagedAttention(pool, batch)
        flops = 4 * cfg.num_heads * cfg.head_dim * (ext * (ctx - ext) + ext * (ext + 1) / 2)
        impls: dict[str, Callable[[], object]] = {
            "triton": functools.partial(backend, AttentionSpec.plain(0, cfg.head_dim), q, k, v)}
        kd = pool.k[0].view(-1, cfg.num_kv_heads, cfg.head_dim)[:ctx]
        vd = pool.v[0].view(-1, cfg.num_kv_heads, cfg.head_dim)[:ctx]
        qh, kh, vh = q.transpose(0, 1)[None], kd.transpose(0, 1)[None], vd.transpose(0, 1)[None]
        if ext == ctx:
            impls["sdpa"] = functools.partial(F.scaled_dot_product_attention, qh, kh, vh,
                                              is_causal=True, enable_gqa=True)
        else:
            mask = (torch.arange(ctx, device=DEV)[None] <= torch.arange(ext, device=DEV)[:, None]
                    + (ctx - ext))
            impls["sdpa"] = functools.partial(F.scaled_dot_product_attention, qh, kh, vh,
                                              attn_mask=mask, enable_gqa=True)
        if flash_attn_func is not None and not DRY:
            impls["flash_attn"] = functools.partial(flash_attn_func, q[None], kd[None],
                                                    vd[None], causal=True)
        for name, fn in impls.items():
            t = timed(fn, reps=5)
            tf = flops / t / 1e12 if t else None
            record("extend", f"{name} T={ext} ctx={ctx}", f"{tf:.0f} TFLOP/s" if tf else "dry",
                   tflops=tf, seconds=t)


def random_llama(cfg: ModelConfig, dtype: torch.dtype) -> DecoderModel:
    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=DEV, dtype=dtype) * 0.02

    h, i = cfg.hidden_size, cfg.intermediate_size
    ones = torch.ones(h, device=DEV, dtype=dtype)
    layers = [LayerWeights(ones, rand(cfg.q_size + 2 * cfg.kv_size, h), None,
                           rand(h, cfg.q_size), ones, rand(2 * i, h), rand(h, i))
              for _ in range(cfg.num_layers)]
    return DecoderModel(cfg, ModelWeights(rand(cfg.vocab_size, h), layers, ones,
                                        rand(cfg.vocab_size, h)), dtype)


def step(model: DecoderModel, pool: KVPool, batch: PagedBatch, positions: torch.Tensor,
         graphs: StaticDecode | None = None, ids: torch.Tensor | None = None) -> torch.Tensor:
    """One engine step: the eager Triton backend, or the static decode path when given."""
    if ids is None:
        ids = torch.randint(0, model.config.vocab_size, (len(positions),), device=DEV)
    if graphs is not None:
        hidden = graphs.forward(ids, positions.to(DEV), batch)
    else:
        hidden = model.forward(ids, positions.to(DEV), TritonPagedAttention(pool, batch))
    ends = torch.tensor(batch.extend_lens, device=DEV).cumsum(0) - 1
    return model.logits(hidden[ends])


def check_model() -> None:
    contexts = [40, 100] if DRY else [4096, 16384, 32768, 65536]
    delta, chunk = (16, 64) if DRY else (512, 8192)
    cfg = (config(2, 64, 4, 2, 16, 128, 1000, 4096) if DRY
           else config(32, 4096, 32, 8, 128, 14336, 128256, 70000))
    model = random_llama(cfg, torch.bfloat16)
    decode_ctx = 20 if DRY else 1024
    pool = make_pool(cfg, max(max(contexts) + delta, 64 * decode_ctx), 16, torch.bfloat16)
    for ctx in contexts:
        total = ctx + delta

        def cached(total: int = total) -> None:
            step(model, pool, make_batch([delta], [total], 16), torch.arange(total - delta, total))

        def uncached(total: int = total) -> None:
            for start in range(0, total, chunk):
                end = min(total, start + chunk)
                step(model, pool, make_batch([end - start], [end], 16), torch.arange(start, end))

        if time.perf_counter() - START > OPTS.budget_s:
            record("ttft", f"ctx={ctx}", "skipped (time budget)")
            continue
        t_unc = timed(uncached, reps=1)
        t_cached = timed(cached, reps=3)
        value = (f"cached {t_cached * 1e3:.0f} ms / uncached {t_unc * 1e3:.0f} ms "
                 f"({t_unc / t_cached:.1f}x)" if t_unc and t_cached else "dry")
        record("ttft", f"ctx={ctx}+{delta}", value, cached_s=t_cached, uncached_s=t_unc)
    sizes = (1, 2, 4) if DRY else (1, 16, 64)
    started = time.perf_counter()
    graphs = StaticDecode(model, pool, sizes, capture=not DRY)  # dry: the same path, eagerly
    log(f"decode graphs for {sizes} ready in {time.perf_counter() - started:.1f} s")
    for batch_size in sizes:
        batch = make_batch([1] * batch_size, [decode_ctx] * batch_size, 16)
        positions = torch.full((batch_size,), decode_ctx - 1)
        ids = torch.randint(0, cfg.vocab_size, (batch_size,), device=DEV)
        want = step(model, pool, batch, positions, None, ids)
        rel = ((step(model, pool, batch, positions, graphs, ids) - want).norm()
               / want.norm()).item()  # same ids: both write the same K/V to the same slots
        ok = rel < 2e-2  # bf16 weights; the graphs split the context differently
        t = timed(functools.partial(step, model, pool, batch, positions))
        t_on = timed(functools.partial(step, model, pool, batch, positions, graphs))
        value = (f"graphs off {batch_size / t:.0f} / on {batch_size / t_on:.0f} tok/s "
                 f"({t * 1e3:.1f} / {t_on * 1e3:.1f} ms/step, {t / t_on:.2f}x)"
                 if t and t_on else "dry")
        record("decode", f"B={batch_size} ctx={decode_ctx}",
               f"{value}, logits rel err {rel:.1e} {'ok' if ok else 'FAIL'}", seconds=t,
               graph_seconds=t_on, rel_err=rel, ok=ok)


def main() -> int:
    OPTS.out.mkdir(parents=True, exist_ok=True)
    failed = False
    for section in (check_correctness, check_decode_bandwidth, check_extend_flops, check_model):
        if time.perf_counter() - START > OPTS.budget_s:
            record(section.__name__, "-", "skipped (time budget)")
            continue
        try:
            with torch.inference_mode():
                section()
        except Exception as exc:  # one broken section must not hide the others' numbers
            failed = True
            record(section.__name__, "-", f"ERROR {type(exc).__name__}: {exc}"[:200])
        if not DRY:
            torch.cuda.empty_cache()
    failed = failed or any(not r.get("ok", True) for section in ("correctness", "decode")
                           for r in RESULTS.get(section, []))
    RESULTS["total_s"] = time.perf_counter() - START
    (OPTS.out / "results.json").write_text(json.dumps(RESULTS, indent=1))
    width = max(len(case) for _, case, _ in ROWS)
    table = "\n".join(f"{sec:<12} {case:<{width}}  {value}" for sec, case, value in ROWS)
    (OPTS.out / "table.txt").write_text(table + "\n")
    print("\n" + table, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
