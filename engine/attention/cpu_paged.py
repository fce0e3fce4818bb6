"""The "cpu" attention backend: decode and draft-verification rows attend straight from the
paged pool in one C/OpenMP kernel (csrc/paged_cpu.c), so a step reads each sequence's K/V once;
longer extends (prefill chunks) use the fused flash path of the "torch" backend.

The kernel is built by pip with the package (setup.py); where it was not (no C compiler),
`kernel()` is None, "auto" picks "torch" and asking for "cpu" by name is a clear error.
"torch_sdpa" is the reference it is tested against (tests/engine/attention/test_cpu_paged.py).
"""

from __future__ import annotations

import functools
from itertools import accumulate
from types import ModuleType

import torch

from engine.attention.base import PagedBatch
from engine.attention.cpu_flash import extend_attention
from engine.errors import InvalidRequest
from engine.kv_pool import KVPool
from engine.native import load_extension

KERNEL_DTYPES = (torch.float32, torch.bfloat16)
MAX_HEAD_DIM = 256


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled extension, or None where the install could not build it."""
    return load_extension("engine.attention._paged_cpu", "Using the torch attention path.")


def _rows_of(t: torch.Tensor) -> int:
    """Elements between rows of a (rows, heads, dim) tensor whose heads and dims are dense;
    -1 when they are not."""
    if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        return -1
    return t.stride(0)


def paged_attention(q: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor,
                    pages: torch.Tensor, page_starts: torch.Tensor, context_lens: torch.Tensor,
                    row_starts: torch.Tensor, page_size: int, split_len: int,
                    new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                    ) -> torch.Tensor:
    """Sequences of few query rows over their paged context. q: (R, Hq, D), sequence s owning
    rows [row_starts[s], row_starts[s + 1]), the last rows of its context_lens[s] tokens (row t
    of T sees positions <= context_len - T + t); flat_k, flat_v: (num_slots, Hkv, D) fp32 or
    bf16, one layer of the pool; pages: every sequence's page ids concatenated, sequence s's
    from page_starts[s]. All index tensors int64 on the CPU. -> (R, Hq, D) in q's dtype.

    `new_kv` = (k, v, slots): the step's new K/V rows ((N, Hkv, D), the pool's dtype or fp32
    into a bf16 pool, rows may be strided, e.g. views of a fused qkv) are first written to
    their slots (int64 (N,)), in the same call."""
    ext = kernel()
    assert ext is not None, "paged_attention needs the built extension"
    num_heads, head_dim = q.shape[1], q.shape[2]
    q32 = q.detach()
    if q32.dtype != torch.float32 or _rows_of(q32) < 0:
        q32 = q32.to(torch.float32).contiguous()
    out = torch.empty(q32.shape, dtype=torch.float32)
    new_k_ptr = new_v_ptr = slots_ptr = new_stride = num_new = 0
    new_fp32 = False
    if new_kv is not None:
        new_k, new_v, slots = new_kv
        new_stride = _rows_of(new_k)
        new_fp32 = new_k.dtype == torch.float32 and flat_k.dtype == torch.bfloat16
        storable = new_k.dtype == flat_k.dtype or new_fp32
        if (new_stride < 0 or _rows_of(new_v) != new_stride or not storable
                or new_v.dtype != new_k.dtype or slots.dtype != torch.int64):
            flat_k[slots] = new_k.to(flat_k.dtype)
            flat_v[slots] = new_v.to(flat_v.dtype)
        else:
            new_k_ptr, new_v_ptr, slots_ptr = new_k.data_ptr(), new_v.data_ptr(), slots.data_ptr()
            num_new = slots.shape[0]
    ext.paged_attention(
        q32.data_ptr(), flat_k.data_ptr(), flat_v.data_ptr(), out.data_ptr(), pages.data_ptr(),
        page_starts.data_ptr(), context_lens.data_ptr(), row_starts.data_ptr(),
        len(context_lens), num_heads, flat_k.shape[1], head_dim, page_size, split_len,
        flat_k.dtype == torch.bfloat16, head_dim**-0.5, torch.get_num_threads(),
        _rows_of(q32), new_k_ptr, new_v_ptr, slots_ptr, new_stride, new_fp32, num_new)
    return out if q.dtype == torch.float32 else out.to(q.dtype)


class CpuPagedAttention:
    name = "cpu"
    # Sequences with at most this many rows in the step go to the kernel (decodes and draft
    # verifications of up to 15 drafts); longer extends use the flash path's GEMMs. At 9 rows
    # the kernel is 1.4-2.5x faster than the torch path at 1k-7.5k context (2 AVX2 cores,
    # benchmarks/attention_speed.py).
    max_kernel_rows = 16
    # Context positions per work item: enough items to keep every thread busy at batch 1
    # (Hkv * context / split_len), few enough that merging them costs little.
    split_len = 256

    def __init__(self, pool: KVPool, batch: PagedBatch) -> None:
        if kernel() is None:
            raise InvalidRequest("attention backend 'cpu' needs the compiled kernel; reinstall "
                                 "radixgate with a C compiler (pip install -e .) or use 'torch'")
        layer = pool.k[0]
        if (layer.dtype not in KERNEL_DTYPES or layer.shape[-1] > MAX_HEAD_DIM
                or layer.device.type != "cpu"):
            raise InvalidRequest(f"attention backend 'cpu' supports fp32/bf16 KV on the CPU "
                                 f"with head_dim <= {MAX_HEAD_DIM}; use 'torch'")
        self.pool = pool
        self.batch = batch
        self.page_size = page_size = pool.layout.page_size
        self.row_starts = [0]
        for extend_len in batch.extend_lens:
            self.row_starts.append(self.row_starts[-1] + extend_len)
        max_rows = self.max_kernel_rows
        short = [i for i, n in enumerate(batch.extend_lens) if n <= max_rows]
        self.long_items = [i for i, n in enumerate(batch.extend_lens) if n > max_rows]
        offsets = torch.arange(page_size)
        self.long_slots = {
            i: (batch.page_tables[i].unsqueeze(1) * page_size + offsets).flatten()[
                : batch.context_lens[i]] for i in self.long_items}
        self.short_items = short
        self.short_rows: torch.Tensor | None = None  # rows of `q` the kernel reads, in order
        if not short:
            return
        tables = [batch.page_tables[i][: -(-batch.context_lens[i] // page_size)] for i in short]
        self.pages = torch.cat(tables).to(torch.int64).contiguous()
        self.page_starts = torch.tensor([0, *accumulate(len(t) for t in tables)][:-1],
                                        dtype=torch.int64)
        self.context_lens = torch.tensor([batch.context_lens[i] for i in short], dtype=torch.int64)
        lens = [batch.extend_lens[i] for i in short]
        self.kernel_row_starts = torch.tensor([0, *accumulate(lens)], dtype=torch.int64)
        if self.long_items:
            self.short_rows = torch.cat([torch.arange(self.row_starts[i], self.row_starts[i + 1])
                                         for i in short])

    def __call__(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        flat_k, flat_v = self.pool.flat_k(layer_idx), self.pool.flat_v(layer_idx)
        if self.short_items and not self.long_items:
            # One call stores the new K/V and attends (a decode step: no torch op at all).
            return self._kernel(q, flat_k, flat_v, (k, v, self.batch.slot_mapping))
        # index_copy_/index_select: 3-5x faster than advanced indexing for these row copies.
        flat_k.index_copy_(0, self.batch.slot_mapping, k.to(flat_k.dtype))
        flat_v.index_copy_(0, self.batch.slot_mapping, v.to(flat_v.dtype))
        out = torch.empty_like(q)
        for i in self.long_items:
            start, end = self.row_starts[i], self.row_starts[i + 1]
            slots = self.long_slots[i]
            # In the pool's dtype: a mixed-precision model's bf16 pool runs bf16 GEMMs here.
            out[start:end] = extend_attention(q[start:end].to(flat_k.dtype),
                                              flat_k.index_select(0, slots),
                                              flat_v.index_select(0, slots))
        if self.short_rows is not None:
            out[self.short_rows] = self._kernel(q[self.short_rows], flat_k, flat_v)
        return out

    def _kernel(self, q: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor,
                new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor:
        return paged_attention(q, flat_k, flat_v, self.pages, self.page_starts, self.context_lens,
                               self.kernel_row_starts, self.page_size, self.split_len, new_kv)
