"""Extend attention (prefill chunks, turn deltas) in C, straight from the paged pool
(csrc/extend_cpu.c), and where it replaces torch's flash kernel.

The "cpu" backend sends sequences of more than `max_kernel_rows` rows here when
`extend_choice` says the C kernel is the faster on this build and pool dtype; otherwise to
`cpu_flash.extend_attention` (torch's flash kernel on K/V gathered out of the pages).
`RADIXGATE_EXTEND_ATTENTION=c|torch` overrides the table. "torch_sdpa" is the reference both
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

# (the kernel's SIMD path, pool dtype) -> (C kernel?, the measurement behind it), from
# `python -m benchmarks.extend_attention_speed` (256 new rows at 1k-7.5k of context, 2 threads,
# against torch's flash kernel on the gathered K/V, the path it replaces; torch time / C time),
# all on one Xeon with AMX (2026-12-06): the lower classes' rows with the kernel built for them
# (-march cooperlake, icelake-server, x86-64-v3) and oneDNN and MKL capped to match
# (bench-results/xeon-amx/extend_attention_speed*.json). "avx512_bf16" is the Zen 4 build: its
# bf16 dot products run at the rate of fp32 FMAs on that Xeon, and oneDNN's AVX512-BF16 GEMMs
# in torch's kernel reach twice the C kernel's rate there (Zen 4 itself not measured).
_FP32, _BF16 = torch.float32, torch.bfloat16
_TABLE: dict[tuple[str, torch.dtype], tuple[bool, str]] = {
    ("amx", _FP32): (True, "fp32 FMAs 1.41-1.87x torch's fp32 flash kernel"),
    ("amx", _BF16): (True, "AMX tiles 1.22-1.35x torch's bf16 flash kernel (itself on AMX)"),
    ("avx512_bf16", _FP32): (True, "fp32 FMAs 1.40-1.53x torch's fp32 flash kernel"),
    ("avx512_bf16", _BF16): (False, "torch's bf16 flash kernel (oneDNN AVX512-BF16) 1.6-2.2x "
                                    "the C kernel's bf16 dot products"),
    ("avx512", _FP32): (True, "fp32 FMAs 1.28-1.50x torch's fp32 flash kernel"),
    ("avx512", _BF16): (True, "bf16 rows widened to fp32 FMAs 1.30-1.43x torch's bf16 flash "
                              "kernel without bf16 instructions"),
    ("avx2", _FP32): (True, "AVX2 FMAs 1.06-1.49x torch's fp32 flash kernel"),
    ("avx2", _BF16): (True, "bf16 rows widened to AVX2 FMAs 1.20-1.36x torch's bf16 flash "
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
    if value not in ("c", "torch"):
        raise InvalidRequest(f"{CHOICE_ENV}={value!r}: use c, torch or auto")
    return value


@functools.cache
def extend_choice(pool_dtype: torch.dtype, head_dim: int) -> tuple[bool, str]:
    """(whether long extends over a `pool_dtype` pool of `head_dim` heads run the C kernel,
    why), logged once per pair."""
    ext = kernel()
    override = _override()
    simd = ext.simd() if ext is not None else ""
    if ext is None:
        use, why = False, "the C extend kernel is not built"
    elif head_dim % 8:
        use, why = False, f"head_dim {head_dim} is not a multiple of 8"
    elif override is not None:
        use, why = override == "c", f"{CHOICE_ENV}={override}"
    elif simd == "amx" and pool_dtype == _BF16 and head_dim % 32:
        # AMX tiles take 32 dims a step; other heads take the AVX512-BF16 dot products, which
        # torch's AMX flash kernel outruns.
        use, why = False, f"AMX tiles need head_dim % 32 == 0 (head_dim {head_dim})"
    else:
        use, why = _TABLE.get((simd, pool_dtype),
                              (False, f"not measured faster for {simd} kernels"))
    logger.info("extend attention over a %s pool, head_dim %d: %s (%s)",
                str(pool_dtype).removeprefix("torch."), head_dim,
                "C kernel" if use else "torch flash", why)
    return use, why


def paged_extend(q: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor,
                 pages: torch.Tensor, page_starts: torch.Tensor, context_lens: torch.Tensor,
                 row_starts: torch.Tensor, extend_lens: torch.Tensor, page_size: int,
                 out: torch.Tensor, *, scale: float, window: int | None = None,
                 sinks: torch.Tensor | None = None) -> None:
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
    kernel does); otherwise it computes in fp32."""
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
    sinks_ptr = 0
    if sinks is not None:
        check_buffer(sinks, "paged_extend sinks", (torch.float32,), (num_heads,))
        sinks_ptr = sinks.data_ptr()
    ext.extend_attention(
        q.data_ptr(), flat_k.data_ptr(), flat_v.data_ptr(), out.data_ptr(), pages.data_ptr(),
        page_starts.data_ptr(), context_lens.data_ptr(), row_starts.data_ptr(),
        extend_lens.data_ptr(), num_seqs, num_heads, flat_k.shape[1], head_dim, page_size,
        flat_k.dtype == torch.bfloat16, float(scale), torch.get_num_threads(), q.stride(0),
        window or 0, sinks_ptr)
