"""Extend attention (prefill chunks, turn deltas) in C, straight from the paged pool
(csrc/extend_cpu.c), and where it replaces torch's flash kernel.

The C kernel computes every row in the arithmetic the decode kernel uses too
(csrc/row_math.h), so a row's attention has the same bits in an extend of any length and
chunking as in a decode or a verification: the "cpu" backend sends it every sequence of more
than `max_kernel_rows` rows wherever that costs at most 5% against the fastest extend path of
the build (`extend_choice`). Where it costs more it takes that path instead, whose bits depend
on how rows came together: AMX tiles for a bf16 pool on Xeons with them ("amx"), torch's flash
kernel on K/V gathered out of the pages (`cpu_flash.extend_attention`) for builds without AVX2
and head dims the kernel does not take. `RADIXGATE_EXTEND_ATTENTION=c|amx|torch` overrides the
table; `--deterministic` (cpu_invariant.py) always takes "c". "torch_sdpa" is the reference all
are tested equal to (tests/engine/attention/test_cpu_extend.py).
"""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType

import torch

from engine.errors import InvalidRequest
from engine.native import check_buffer, load_extension, require

logger = logging.getLogger(__name__)

CHOICE_ENV = "RADIXGATE_EXTEND_ATTENTION"
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
# (pages, page_starts, context_lens, row_starts, extend_lens): which rows and pages of a batch
# the kernel takes (paged_extend's arguments of those names).
ExtendIndex = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

# What each path is: "c" the C kernel in row_math.h's arithmetic (a row's bits as in a decode);
# "amx" the C kernel with AMX tiles for a bf16 pool (faster on Xeons that have them, its sums in
# the tile unit's order); "torch" torch's flash kernel on the gathered K/V.
PATHS = ("c", "amx", "torch")
# (the kernel's SIMD path, pool dtype) -> (path, the measurement behind it), from
# `python -m benchmarks.extend_attention_speed` (256 new rows at 1k-8k of context, torch time /
# C time, the K/V store included). The avx512_bf16 rows were measured on a CPU of that class
# (Zen 5, 2026-12-07, one thread and its CPU time: the machine was shared); the others on one
# Xeon with AMX (2026-12-06, 2 threads), the lower classes with the kernel built for them (-march
# icelake-server, x86-64-v3) and oneDNN and MKL capped to match
# (bench-results/xeon-amx/extend_attention_speed*.json), where the C kernel was already the
# default: row_math.h's order changed its time by -9% to +3% on Zen 5 (avx512_bf16 and
# x86-64-v3 builds, medians). On that Xeon a bf16 pool's AMX tiles run 2-3x the AVX512-BF16 dot
# products "c" must use (AMX 1.22-1.35x torch's AMX flash kernel, itself 1.6-2.2x the dot
# products), so "amx" stays there.
_FP32, _BF16 = torch.float32, torch.bfloat16
_TABLE: dict[tuple[str, torch.dtype], tuple[str, str]] = {
    ("amx", _FP32): ("c", "fp32 FMAs 1.41-1.87x torch's fp32 flash kernel"),
    ("amx", _BF16): ("amx", "AMX tiles 1.22-1.35x torch's bf16 flash kernel (itself on AMX), "
                            "2-3x the bf16 dot products of row_math.h's order"),
    ("avx512_bf16", _FP32): ("c", "fp32 FMAs 2.0-2.6x torch's fp32 flash kernel on Zen 5"),
    ("avx512_bf16", _BF16): ("c", "bf16 dot products 3.7-4.5x torch's bf16 flash kernel on "
                                  "Zen 5"),
    ("avx512", _FP32): ("c", "fp32 FMAs 1.28-1.50x torch's fp32 flash kernel"),
    ("avx512", _BF16): ("c", "bf16 rows widened to fp32 FMAs 1.30-1.43x torch's bf16 flash "
                             "kernel without bf16 instructions"),
    ("avx2", _FP32): ("c", "AVX2 FMAs 1.06-1.49x torch's fp32 flash kernel"),
    ("avx2", _BF16): ("c", "bf16 rows widened to AVX2 FMAs 1.20-1.36x torch's bf16 flash "
                           "kernel"),
}


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled extension, or None where the install could not build it."""
    return load_extension("engine.attention._extend_cpu", "Extends use torch's flash kernel.")


def _override() -> str | None:
    value = os.environ.get(CHOICE_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in PATHS:
        raise InvalidRequest(f"{CHOICE_ENV}={value!r}: use c, amx, torch or auto")
    return value


def c_kernel_takes(head_dim: int) -> bool:
    """Whether the C extend kernel is built and takes heads of `head_dim` dims."""
    return kernel() is not None and head_dim % 8 == 0


@functools.cache
def extend_choice(pool_dtype: torch.dtype, head_dim: int) -> tuple[str, str]:
    """(the path long extends over a `pool_dtype` pool of `head_dim` heads take, one of
    PATHS, why), logged once per pair. Only "c" gives a row the bits a decode gives it."""
    ext = kernel()
    override = _override()
    simd = ext.simd() if ext is not None else ""
    if ext is None:
        path, why = "torch", "the C extend kernel is not built"
    elif head_dim % 8:
        path, why = "torch", f"head_dim {head_dim} is not a multiple of 8"
    elif override is not None:
        path, why = override, f"{CHOICE_ENV}={override}"
    elif simd == "amx" and pool_dtype == _BF16 and head_dim % 32:
        # AMX tiles take 32 dims a step; other heads would take the AVX512-BF16 dot products,
        # which torch's AMX flash kernel outruns 1.6-2.2x.
        path, why = "torch", f"AMX tiles need head_dim % 32 == 0 (head_dim {head_dim})"
    else:
        path, why = _TABLE.get((simd, pool_dtype),
                               ("torch", f"not measured faster for {simd} kernels"))
    if path == "amx" and (simd != "amx" or pool_dtype != _BF16):
        path, why = "c", f"{why}; no AMX tiles for a {pool_dtype} pool in a {simd} build"
    logger.info("extend attention over a %s pool, head_dim %d: %s (%s)",
                str(pool_dtype).removeprefix("torch."), head_dim,
                {"c": "C kernel, decode's bits", "amx": "C kernel, AMX tiles",
                 "torch": "torch flash"}[path], why)
    return path, why


def paged_extend(q: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor,
                 pages: torch.Tensor, page_starts: torch.Tensor, context_lens: torch.Tensor,
                 row_starts: torch.Tensor, extend_lens: torch.Tensor, page_size: int,
                 out: torch.Tensor, *, scale: float, window: int | None = None,
                 sinks: torch.Tensor | None = None, split_len: int = 256,
                 amx: bool = False) -> None:
    """Attention of the new rows of several sequences over their paged context, into `out`.

    q: (R, Hq, D) fp32, heads and dims dense; out: (R, Hq, D) fp32 contiguous. Sequence s owns
    rows [row_starts[s], row_starts[s] + extend_lens[s]) of both (other rows are neither read
    nor written): the last extend_lens[s] of its context_lens[s] tokens, whose K/V, the new
    rows' included, are already in the pool. Row t at position p = context_len - T + t sees
    positions [0, p], or (p - W, p] with a sliding `window` of W keys (pages wholly before the
    first row's window are never read). flat_k, flat_v: (num_slots, Hkv, D) fp32 or bf16, one
    layer; pages: every sequence's page ids concatenated, sequence s's from page_starts[s].
    `scale` multiplies q.k; `sinks` (fp32 (Hq,)): a logit per query head that joins the
    softmax's denominator with no value. Index tensors int64 on the CPU. A bf16 pool on a CPU
    with bf16 dot products rounds q and the softmax weights to bf16 (as torch's bf16 flash
    kernel does); otherwise it computes in fp32.

    Each row is computed as csrc/row_math.h says, with splits of `split_len` positions: the
    decode kernel (`cpu_paged.paged_attention`) given the same `split_len` gives the row the
    same bits, whatever else either call computes. `amx`: a bf16 pool may take AMX tiles where
    the build and the CPU have them, faster and without that guarantee."""
    ext = require(kernel(), "paged_extend")
    num_heads, head_dim = q.shape[1], q.shape[2]
    for name, t in (("pages", pages), ("page_starts", page_starts),
                    ("context_lens", context_lens), ("row_starts", row_starts),
                    ("extend_lens", extend_lens)):
        check_buffer(t, f"paged_extend {name}", (torch.int64,))
    check_buffer(flat_k, "paged_extend K pool", KERNEL_DTYPES)
    check_buffer(flat_v, "paged_extend V pool", (flat_k.dtype,), tuple(flat_k.shape))
    check_buffer(out, "paged_extend out", (torch.float32,), tuple(q.shape))
    num_seqs = context_lens.shape[0]
    if page_starts.shape[0] != num_seqs or row_starts.shape[0] != num_seqs \
            or extend_lens.shape[0] != num_seqs:
        raise ValueError("paged_extend: page_starts, context_lens, row_starts and extend_lens "
                         "must have an entry per sequence")
    if (q.dtype != torch.float32 or not q.is_cpu or q.dim() != 3 or q.stride(2) != 1
            or q.stride(1) != head_dim or head_dim != flat_k.shape[2] or head_dim % 8
            or num_heads % flat_k.shape[1]):
        raise ValueError(f"paged_extend: q {list(q.shape)} ({q.dtype}) does not fit the pool's "
                         f"{flat_k.shape[1]} KV heads of {flat_k.shape[2]} (fp32, dims dense, "
                         f"head_dim a multiple of 8)")
    if window is not None and window < 1:
        raise ValueError(f"paged_extend: window must be >= 1, got {window}")
    if isinstance(split_len, bool) or not isinstance(split_len, int) or split_len < 1:
        raise ValueError(f"paged_extend: split_len must be an int >= 1, got {split_len!r}")
    sinks_ptr = 0
    if sinks is not None:
        check_buffer(sinks, "paged_extend sinks", (torch.float32,), (num_heads,))
        sinks_ptr = sinks.data_ptr()
    ext.extend_attention(
        q.data_ptr(), flat_k.data_ptr(), flat_v.data_ptr(), out.data_ptr(), pages.data_ptr(),
        page_starts.data_ptr(), context_lens.data_ptr(), row_starts.data_ptr(),
        extend_lens.data_ptr(), num_seqs, num_heads, flat_k.shape[1], head_dim, page_size,
        flat_k.dtype == torch.bfloat16, float(scale), torch.get_num_threads(), q.stride(0),
        window or 0, sinks_ptr, split_len, amx)
