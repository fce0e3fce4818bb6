"""The CPU kernel for every row: attention whose bits for a row do not depend on the batch.

`CpuPagedAttention` sends decodes and verifications (at most 16 rows of a sequence) to the C
kernel and longer extends to torch's flash GEMMs, whose tiling depends on how many rows came
together. Here a long extend is cut into pieces of at most 16 rows, each a sequence of its own
for the kernel (the same pages, its context ending at the piece's last row), so every row is
computed as a decode at its position would be: its keys in tiles and splits on a grid of
absolute positions, merged in a fixed order, whatever else shares the step. It is the attention
of `--deterministic`; slower for long prefills, where the flash GEMMs reuse each key across
many rows.
"""

from __future__ import annotations

from engine.attention.base import PagedBatch
from engine.attention.cpu_paged import CpuPagedAttention
from engine.kv_pool import KVPool


def _pieces(batch: PagedBatch, max_rows: int) -> PagedBatch:
    """`batch` with each sequence longer than `max_rows` rows cut into consecutive pieces of at
    most `max_rows`, in row order (the rows and their slots are unchanged)."""
    extend_lens: list[int] = []
    context_lens: list[int] = []
    tables = []
    for extend_len, context_len, table in zip(batch.extend_lens, batch.context_lens,
                                              batch.page_tables, strict=True):
        start = context_len - extend_len
        for first in range(0, extend_len, max_rows):
            rows = min(max_rows, extend_len - first)
            extend_lens.append(rows)
            context_lens.append(start + first + rows)
            tables.append(table)
    return PagedBatch(extend_lens, context_lens, batch.slot_mapping, tables)


class InvariantCpuAttention(CpuPagedAttention):
    name = "cpu_invariant"

    def __init__(self, pool: KVPool, batch: PagedBatch) -> None:
        super().__init__(pool, _pieces(batch, self.max_kernel_rows))
        assert not self.long_items
