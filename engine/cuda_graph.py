"""Decode steps over preallocated static buffers, replayed as CUDA graphs on CUDA.

A decode batch (every sequence adds one token) has the same tensor shapes from one step to the
next at a given batch size once its inputs live in fixed buffers: input ids, positions, slot
mapping, context lengths and a page table as wide as the longest context the engine can hold.
Such a step is captured once per batch size with `torch.cuda.graphs` and replayed, which removes
the per-kernel launch cost (hundreds of launches a step) that dominates small-batch decode.

Attention is the Triton split-K decode kernel over the padded page table: its grid depends only
on the batch size and the fixed maximum context, and its loop bounds come from the context-length
buffer on the device, so one captured graph serves every context length. Padding rows (a batch
of 3 replayed in the graph of 4) get slot -1, which the store kernel skips, context length 1 and
page 0; their outputs are dropped.

`StaticDecode(capture=False)` runs the same buffers and kernels eagerly, which is how the CPU
tests (Triton interpreter) prove the static path generates what the normal path does. Triton is
imported only when a `StaticDecode` is built, so importing this module costs nothing.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Sequence

import torch

from engine.attention.base import PagedBatch
from engine.attention.spec import AttentionSpec
from engine.errors import InvalidRequest
from engine.kv_pool import KVPool
from engine.models.base import Model

logger = logging.getLogger(__name__)

# Eager backends whose decode steps the graphs may replace. The torch backends are the reference
# fallback: with them every step runs as it is, graphs or not.
GRAPH_BACKENDS = ("triton", "flash_attn")


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... below `max_batch_size`, then `max_batch_size` itself: every decode batch up
    to it fits a graph at most twice its size."""
    if max_batch_size < 1:
        raise InvalidRequest(f"max batch size must be >= 1, got {max_batch_size}")
    sizes: list[int] = []
    size = 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return [*sizes, max_batch_size]


class DecodeBuffers:
    """Static inputs of the largest batch size; a batch of n uses the first n rows of each.

    Rows past the live batch keep stale but valid values (token ids, positions and page ids
    written earlier), except `slot_mapping`, which is -1 there so nothing is stored.
    """

    def __init__(self, max_batch_size: int, max_pages: int, device: torch.device) -> None:
        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(max_batch_size)
        self.positions = zeros(max_batch_size)
        self.slot_mapping = torch.full((max_batch_size,), -1, dtype=torch.long, device=device)
        self.context_lens = torch.ones(max_batch_size, dtype=torch.int32, device=device)
        self.page_table = zeros(max_batch_size, max_pages, dtype=torch.int32)
        self.q_rows = torch.arange(max_batch_size, dtype=torch.int32, device=device)


class StaticDecodeAttention:
    """Paged decode attention (an `AttentionFn`) for the first `batch_size` rows of `buffers`:
    store the new K/V, then the split-K decode kernel with a fixed split count. Launches no
    host sync and allocates nothing the graph cannot own, so it is capturable."""

    name = "static_decode"

    def __init__(self, pool: KVPool, buffers: DecodeBuffers, batch_size: int,
                 max_context_len: int) -> None:
        # Imported here: triton reads TRITON_INTERPRET when the kernels are first defined.
        from engine.attention.triton_decode import decode_attention
        from engine.attention.triton_kernels import store_kv

        self._decode, self._store = decode_attention, store_kv
        self.pool = pool
        self.buffers = buffers
        self.batch_size = batch_size
        self.max_context_len = max_context_len

    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.pool.k[spec.layer_idx], self.pool.v[spec.layer_idx]
        b, n = self.buffers, self.batch_size
        self._store(k, v, k_cache, v_cache, b.slot_mapping[:n])
        if q.stride(2) != 1:
            q = q.contiguous()
        out = torch.empty_like(q)
        # max_context_len is the buffers' width, not this batch's: the split count and split
        # length it implies must not change between capture and replay.
        self._decode(q, k_cache, v_cache, out, b.q_rows[:n], b.context_lens[:n],
                     b.page_table[:n], self.max_context_len, sm_scale=spec.scale)
        return out


class StaticDecode:
    """Runs decode batches (every row a one-token extend) through static buffers.

    `batch_sizes`: the padded sizes a batch may run at; `capture=True` (CUDA only) records one
    CUDA graph per size at construction and replays it, `capture=False` runs the same code
    eagerly. `max_context_len` defaults to what both the model and the KV pool can hold.
    """

    def __init__(self, model: Model, pool: KVPool, batch_sizes: Sequence[int], *,
                 capture: bool, max_context_len: int | None = None) -> None:
        device = pool.k[0].device
        if device != model.device:
            raise InvalidRequest(f"KV pool on {device} but the model on {model.device}")
        if capture and device.type != "cuda":
            raise InvalidRequest(f"CUDA graphs need a CUDA device; the model is on {device}")
        featured = sorted({f for spec in model.attention_specs for f in spec.features})
        if featured:
            raise InvalidRequest(f"static decode runs the Triton decode kernel, which has no "
                                 f"{', '.join(featured)}; use an eager backend for this model")
        if device.type == "cpu" and not _interpreter_on():
            raise InvalidRequest("static decode on CPU runs Triton kernels: set "
                                 "TRITON_INTERPRET=1 before triton is imported")
        self.model = model
        self.batch_sizes = sorted(set(batch_sizes))
        self.max_batch_size = self.batch_sizes[-1]
        page_size = pool.layout.page_size
        limit = max_context_len or min(model.config.max_position_embeddings,
                                       pool.layout.num_tokens)
        max_pages = -(-limit // page_size)
        self.max_context_len = max_pages * page_size
        self.buffers = DecodeBuffers(self.max_batch_size, max_pages, device)
        self.attention = {size: StaticDecodeAttention(pool, self.buffers, size,
                                                      self.max_context_len)
                          for size in self.batch_sizes}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_steps = 0  # batches run through this path (tests and logs read it)
        if capture:
            self._capture_all()

    def accepts(self, batch: PagedBatch) -> bool:
        """True for a decode batch this path can run: one new row per sequence, at most the
        largest batch size, every context within the page-table width, no tree masks (the
        static buffers carry none: such a batch runs the eager backend)."""
        return (0 < len(batch.extend_lens) <= self.max_batch_size
                and not batch.tree_masks
                and all(n == 1 for n in batch.extend_lens)
                and max(batch.context_lens) <= self.max_context_len)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                batch: PagedBatch) -> torch.Tensor:
        """Final hidden states (n, hidden) of a batch `accepts` took, as `Model.forward`
        returns them. With graphs the result is a view of graph memory: valid until the next
        call, so read (or copy) it before running another batch."""
        num_rows = input_ids.shape[0]
        size = next(s for s in self.batch_sizes if s >= num_rows)
        self._fill(input_ids, positions, batch, size)
        self.num_steps += 1
        captured = self.graphs.get(size)
        if captured is None:
            return self._forward(size)[:num_rows]
        graph, hidden = captured
        graph.replay()
        return hidden[:num_rows]

    def _forward(self, size: int) -> torch.Tensor:
        b = self.buffers
        return self.model.forward(b.input_ids[:size], b.positions[:size], self.attention[size])

    def _fill(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: PagedBatch,
              size: int) -> None:
        """Copy one batch into the leading rows of the buffers; rows up to `size` are padding."""
        b, n = self.buffers, input_ids.shape[0]
        b.input_ids[:n].copy_(input_ids)
        b.positions[:n].copy_(positions)
        b.slot_mapping[:n].copy_(batch.slot_mapping)
        if size > n:
            b.slot_mapping[n:size].fill_(-1)
        # Context lengths and page ids are built on the host, then copied in once each. Only the
        # columns this batch uses are written: the kernel reads no entry past a context's end.
        b.context_lens[:size].copy_(torch.tensor([*batch.context_lens, *[1] * (size - n)],
                                                 dtype=torch.int32))
        width = max(len(table) for table in batch.page_tables)
        table = torch.zeros((size, width), dtype=torch.int32)
        for i, pages in enumerate(batch.page_tables):
            table[i, : len(pages)] = pages
        b.page_table[:size, :width].copy_(table)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        started = time.perf_counter()
        mempool = torch.cuda.graph_pool_handle()
        # Largest first: the smaller graphs then reuse the memory pool the largest reserved.
        for size in reversed(self.batch_sizes):
            # Warm-up outside capture: compiles the Triton kernels and initialises cuBLAS,
            # neither of which may happen during capture. The buffers hold slot -1 everywhere
            # here (nothing has run), so the warm-up stores no K/V.
            self._forward(size)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=mempool):
                hidden = self._forward(size)
            self.graphs[size] = (graph, hidden)
        torch.cuda.synchronize()
        logger.info("captured %d decode CUDA graphs (batch sizes %s) in %.1f s",
                    len(self.graphs), self.batch_sizes, time.perf_counter() - started)


def make_static_decode(model: Model, pool: KVPool, backend_name: str, max_running: int,
                       cuda_graphs: bool) -> StaticDecode | None:
    """The engine's CUDA-graph decode path, or None where it does not apply: on the CPU, with
    graphs turned off, without triton, or under a torch backend (kept as the plain fallback)."""
    if model.device.type != "cuda" or not cuda_graphs or pool.layout.has_swa:
        return None
    if backend_name not in GRAPH_BACKENDS or importlib.util.find_spec("triton") is None:
        logger.info("CUDA graphs off: attention backend %s (graphs need triton and one of %s)",
                    backend_name, GRAPH_BACKENDS)
        return None
    if _interpreter_on():  # interpreted kernels run on the host: there is nothing to capture
        logger.info("CUDA graphs off: TRITON_INTERPRET is set")
        return None
    return StaticDecode(model, pool, graph_batch_sizes(max_running), capture=True)


def _interpreter_on() -> bool:
    from engine.attention.triton_backend import interpreter_enabled

    return interpreter_enabled()
