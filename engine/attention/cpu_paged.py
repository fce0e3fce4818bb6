"""The "cpu" attention backend: decode and draft-verification rows attend straight from the
paged pool in one C/OpenMP kernel (csrc/paged_cpu.c), so a step reads each sequence's K/V once;
longer extends (prefill chunks) run the C extend kernel (csrc/extend_cpu.c), or where
`cpu_extend.extend_choice` says it costs more than 5%, AMX tiles or the fused flash path of the
"torch" backend. A draft tree's rows (`PagedBatch.tree_masks`, at most 63) always go to the
paged kernel, the one path here that reads a mask, whatever `max_kernel_rows` says.

Both C kernels compute a row as csrc/row_math.h says, so where long extends take the C kernel
("c") a row's attention has a decode's bits in a verification or a tree (a chain mask is the
causal row) and inside an extend of any length and chunking, beside any other sequences.

The kernel is built by pip with the package (setup.py); where it was not (no C compiler),
`kernel()` is None, "auto" picks "torch" and asking for "cpu" by name is a clear error.
"torch_sdpa" is the reference it is tested against (tests/engine/attention/test_cpu_paged.py).
"""

from __future__ import annotations

import functools
import math
from itertools import accumulate
from types import ModuleType

import torch

from engine.attention.base import PagedBatch
from engine.attention.cpu_extend import ExtendIndex, extend_choice, paged_extend
from engine.attention.cpu_flash import extend_attention
from engine.attention.spec import AttentionSpec, first_visible
from engine.attention.tree import check_tree_spec, row_masks
from engine.errors import InvalidRequest
from engine.kv_pool import KVPool
from engine.native import check_buffer, load_extension, require

KERNEL_DTYPES = (torch.float32, torch.bfloat16)
KERNEL_FEATURES = frozenset({"window", "sinks"})
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
                    new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, *,
                    scale: float | None = None, window: int | None = None,
                    sinks: torch.Tensor | None = None, masks: torch.Tensor | None = None,
                    _layout_checked: bool = False) -> torch.Tensor:
    """Sequences of few query rows over their paged context. q: (R, Hq, D), sequence s owning
    rows [row_starts[s], row_starts[s + 1]), the last rows of its context_lens[s] tokens (row t
    of T, at position p = context_len - T + t, sees positions <= p); flat_k, flat_v:
    (num_slots, Hkv, D) fp32 or bf16, one layer of the pool; pages: every sequence's page ids
    concatenated, sequence s's from page_starts[s] (its page i holds positions
    [i * page_size, (i + 1) * page_size)). All index tensors int64 on the CPU. -> (R, Hq, D)
    in q's dtype.

    `new_kv` = (k, v, slots): the step's new K/V rows ((N, Hkv, D), the pool's dtype or fp32
    into a bf16 pool, rows may be strided, e.g. views of a fused qkv) are first written to
    their slots (int64 (N,)), in the same call.

    Per-layer options: `scale` multiplies q.k before the softmax (None: D ** -0.5). `window`
    = W >= 1 is a sliding window: the row at position p sees positions (p - W, p], W keys
    counting itself (transformers' `sliding_window`; FlashAttention's window_left = W - 1);
    None is full causal. Only the positions some row sees are read, so a step costs O(W),
    not O(context): the ids of a sequence's pages that lie wholly before p_first - W + 1
    (p_first: the position of its first row) are never read and may be anything, -1 or a
    page reused by another sequence included. `sinks`: fp32 (Hq,) CPU tensor, one logit per
    query head that joins the softmax's denominator with no value (gpt-oss): row output
    sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + e^(sink - m)); None: no sink.

    `masks`: int64 (R,) CPU, one tree mask per row of q (engine.attention.tree), not with a
    window. Row t of its sequence's T sees every position < context_len - T and the step's row
    j (position context_len - T + j) iff bit j of its entry is set; bits above t are never
    read. An entry 0 is a causal row; a chain mask (2^(t + 1) - 1) gives the causal row's bits.
    None: every row causal. A row's bits (csrc/row_math.h) depend on no other row or sequence,
    and `cpu_extend.paged_extend` with the same `split_len` gives it the same bits."""
    ext = require(kernel(), "paged_attention")
    num_heads, head_dim = q.shape[1], q.shape[2]
    if not _layout_checked:  # CpuPagedAttention checks a step's tensors once, not per layer
        _check_layout(q, flat_k, flat_v, (pages, page_starts, context_lens, row_starts))
    elif not (q.is_cpu and q.dim() == 3 and q.shape[2] == flat_k.shape[2]):
        raise ValueError(f"paged_attention: q {list(q.shape)} on {q.device} does not fit the "
                         f"pool's heads of {flat_k.shape[2]}")
    if scale is None:
        scale = head_dim**-0.5
    elif type(scale) is float and math.isfinite(scale):
        pass  # the engine's case, decided in one test (this runs once per layer and step)
    elif isinstance(scale, bool) or not isinstance(scale, int | float):
        raise TypeError(f"paged_attention: scale must be a float, got {type(scale).__name__}")
    elif not abs(scale) < float("inf"):
        raise ValueError(f"paged_attention: scale must be finite, got {scale}")
    if window is None:
        window = 0  # the kernel's "no window"
    elif type(window) is not int:
        raise TypeError(f"paged_attention: window must be an int, got {type(window).__name__}")
    elif window < 1:
        raise ValueError(f"paged_attention: window must be >= 1, got {window}")
    sinks_ptr = 0
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or sinks.dtype != torch.float32:
            raise TypeError("paged_attention: sinks must be a float32 tensor, got "
                            f"{getattr(sinks, 'dtype', type(sinks).__name__)}")
        if sinks.device.type != "cpu" or sinks.shape != (num_heads,) or not sinks.is_contiguous():
            raise ValueError(f"paged_attention: sinks must be a contiguous CPU tensor of shape "
                             f"({num_heads},) (one per query head), got {tuple(sinks.shape)} on "
                             f"{sinks.device}{'' if sinks.is_contiguous() else ', strided'}")
        sinks_ptr = sinks.data_ptr()
    masks_ptr = 0
    if masks is not None:
        if not _layout_checked:
            check_buffer(masks, "paged_attention masks", (torch.int64,), (q.shape[0],))
        if window:
            raise ValueError("paged_attention: tree masks are not supported with a window")
        masks_ptr = masks.data_ptr()
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
        flat_k.dtype == torch.bfloat16, scale, torch.get_num_threads(), _rows_of(q32),
        new_k_ptr, new_v_ptr, slots_ptr, new_stride, new_fp32, num_new, window, sinks_ptr,
        masks_ptr)
    return out if q.dtype == torch.float32 else out.to(q.dtype)


def _check_layout(q: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor,
                  index: tuple[torch.Tensor, ...]) -> None:
    """What the kernel's raw pointers assume, checked before it reads them."""
    for name, t in zip(("pages", "page_starts", "context_lens", "row_starts"), index, strict=True):
        check_buffer(t, f"paged_attention {name}", (torch.int64,))
    check_buffer(flat_k, "paged_attention K pool", KERNEL_DTYPES)
    check_buffer(flat_v, "paged_attention V pool", (flat_k.dtype,), tuple(flat_k.shape))
    num_seqs = index[2].shape[0]
    if index[1].shape[0] != num_seqs or index[3].shape[0] != num_seqs + 1:
        raise ValueError("paged_attention: page_starts, context_lens and row_starts (one more) "
                         "must have an entry per sequence")
    if (q.dim() != 3 or q.device.type != "cpu" or q.shape[2] != flat_k.shape[2]
            or q.shape[2] > MAX_HEAD_DIM or q.shape[1] % flat_k.shape[1]):
        raise ValueError(f"paged_attention: q {list(q.shape)} does not fit the pool's "
                         f"{flat_k.shape[1]} KV heads of {flat_k.shape[2]} (head_dim <= "
                         f"{MAX_HEAD_DIM})")


class CpuPagedAttention:
    name = "cpu"
    supports_tree_masks = True
    # Sequences of at most this many rows in the step go to the kernel (decodes, verifications
    # of up to 15 drafts), whose items split the context; longer extends to the extend kernel,
    # whose items share each K/V tile across up to 64 tokens. On "c", speed only, not bits.
    max_kernel_rows = 16
    # Where long extends go ("c": the C kernel, cpu_invariant's); None: `extend_choice` says.
    extend_path: str | None = None
    # Context positions per work item: enough items to keep every thread busy at batch 1
    # (Hkv * context / split_len), few enough that merging them costs little. Part of a row's
    # arithmetic (csrc/row_math.h), so both kernels take it.
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
        max_rows, tree = self.max_kernel_rows, batch.tree_masks or {}
        # Tree-masked sequences are kernel items however long: no other path reads a mask.
        short = [i for i, n in enumerate(batch.extend_lens) if n <= max_rows or i in tree]
        self.long_items = [i for i, n in enumerate(batch.extend_lens)
                           if n > max_rows and i not in tree]
        self.extend_index: ExtendIndex | None = None  # the C extend kernel's, or torch's
        path = "torch" if not self.long_items else (
            self.extend_path or extend_choice(layer.dtype, layer.shape[-1])[0])
        self.extend_amx = path == "amx"
        if path != "torch":
            self.extend_index = self._index(self.long_items)
        offsets = torch.arange(page_size)
        self.long_slots = {
            i: (batch.page_tables[i].unsqueeze(1) * page_size + offsets).flatten()[
                : batch.context_lens[i]]
            for i in (self.long_items if self.extend_index is None else ())}
        self.short_items = short
        self.short_rows: torch.Tensor | None = None  # rows of `q` the kernel reads, in order
        # One entry per kernel row (0: causal), None without a tree of several rows.
        self.masks = row_masks(batch.tree_masks, batch.extend_lens, short)
        if not short:
            return
        tables = [batch.page_tables[i][: -(-batch.context_lens[i] // page_size)] for i in short]
        self.pages = torch.cat(tables).to(torch.int64).contiguous()
        self.page_starts = torch.tensor([0, *accumulate(len(t) for t in tables)][:-1],
                                        dtype=torch.int64)
        self.context_lens = torch.tensor([batch.context_lens[i] for i in short], dtype=torch.int64)
        lens = [batch.extend_lens[i] for i in short]
        self.kernel_row_starts = torch.tensor([0, *accumulate(lens)], dtype=torch.int64)
        # Once a step: every layer's call reads these same tensors and an equal pool layer.
        query = torch.empty(0, pool.k[0].shape[2], pool.k[0].shape[3])
        _check_layout(query, pool.flat_k(0), pool.flat_v(0), (self.pages, self.page_starts,
                                                              self.context_lens,
                                                              self.kernel_row_starts))
        if self.long_items:
            self.short_rows = torch.cat([torch.arange(self.row_starts[i], self.row_starts[i + 1])
                                         for i in short])

    def _index(self, items: list[int]) -> ExtendIndex:
        """(pages, page_starts, context_lens, row_starts, extend_lens) of `items` for the
        extend kernel: the page ids that cover each context, concatenated."""
        batch, page_size = self.batch, self.page_size
        tables = [batch.page_tables[i][: -(-batch.context_lens[i] // page_size)] for i in items]
        return (torch.cat(tables).to(torch.int64).contiguous(),
                torch.tensor([0, *accumulate(len(t) for t in tables)][:-1], dtype=torch.int64),
                torch.tensor([batch.context_lens[i] for i in items], dtype=torch.int64),
                torch.tensor([self.row_starts[i] for i in items], dtype=torch.int64),
                torch.tensor([batch.extend_lens[i] for i in items], dtype=torch.int64))

    @classmethod
    def unsupported(cls, spec: AttentionSpec) -> list[str]:
        """The kernel and the flash path take a scale, windows and sinks; softcap is not
        written in either."""
        return sorted(spec.features - KERNEL_FEATURES)

    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        if self.masks is not None:
            check_tree_spec(spec)
        flat_k, flat_v = self.pool.flat_k(spec.layer_idx), self.pool.flat_v(spec.layer_idx)
        if self.short_items and not self.long_items:
            # One call stores the new K/V and attends (a decode step: no torch op at all).
            return self._kernel(spec, q, flat_k, flat_v, (k, v, self.batch.slot_mapping))
        # index_copy_/index_select: 3-5x faster than advanced indexing for these row copies.
        flat_k.index_copy_(0, self.batch.slot_mapping, k.to(flat_k.dtype))
        flat_v.index_copy_(0, self.batch.slot_mapping, v.to(flat_v.dtype))
        if self.extend_index is not None:
            # The C kernel writes the long sequences' rows; short rows are filled below.
            q32 = q if q.dtype == torch.float32 and _rows_of(q) >= 0 else q.float().contiguous()
            out32 = torch.empty(q.shape, dtype=torch.float32)
            paged_extend(q32, flat_k, flat_v, *self.extend_index, self.page_size, out32,
                         scale=spec.scale, window=spec.window, sinks=spec.sinks,
                         split_len=self.split_len, amx=self.extend_amx)
            if self.short_rows is not None:
                out32[self.short_rows] = self._kernel(spec, q32[self.short_rows], flat_k, flat_v)
            return out32 if q.dtype == torch.float32 else out32.to(q.dtype)
        out = torch.empty_like(q)
        for i in self.long_items:
            start, end = self.row_starts[i], self.row_starts[i + 1]
            # A sliding window's rows see no key before `lo`: those are never read.
            lo = first_visible(spec, self.batch.context_lens[i] - (end - start))
            slots = self.long_slots[i][lo:]
            # In the pool's dtype: a mixed-precision model's bf16 pool runs bf16 GEMMs here.
            out[start:end] = extend_attention(q[start:end].to(flat_k.dtype),
                                              flat_k.index_select(0, slots),
                                              flat_v.index_select(0, slots), spec)
        if self.short_rows is not None:
            out[self.short_rows] = self._kernel(spec, q[self.short_rows], flat_k, flat_v)
        return out

    def _kernel(self, spec: AttentionSpec, q: torch.Tensor, flat_k: torch.Tensor,
                flat_v: torch.Tensor,
                new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor:
        return paged_attention(q, flat_k, flat_v, self.pages, self.page_starts, self.context_lens,
                               self.kernel_row_starts, self.page_size, self.split_len, new_kv,
                               scale=spec.scale, window=spec.window, sinks=spec.sinks,
                               masks=self.masks, _layout_checked=True)
