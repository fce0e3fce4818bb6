"""The CPU kernel for every row: attention whose bits for a row do not depend on the batch.

`CpuPagedAttention` sends decodes and verifications (at most 16 rows of a sequence) to the C
kernel and longer extends to torch's flash GEMMs, whose tiling depends on how many rows came
together. Here a long extend is cut into pieces of at most 16 rows, each a sequence of its own
for the kernel (the same pages, its context ending at the piece's last row), so every row is
computed as a decode at its position would be: its keys in tiles and splits on a grid of
absolute positions, merged in a fixed order, whatever else shares the step. It is the attention
of `--deterministic`; slower for long prefills, where the flash GEMMs reuse each key across
many rows.

A draft tree's sequence (`PagedBatch.tree_masks`, at most 63 rows) is never cut: a later piece
would see the earlier pieces' rows as its prefix, not through the mask. It goes to the kernel
whole, where each row's bits depend only on its own mask and position, not on the batch.
"""

from __future__ import annotations

from engine.attention.base import PagedBatch
from engine.attention.cpu_paged import CpuPagedAttention
from engine.kv_pool import KVPool


def _pieces(batch: PagedBatch, max_rows: int) -> PagedBatch:
    """`batch` with each sequence longer than `max_rows` rows cut into consecutive pieces of at
    most `max_rows`, in row order (the rows and their slots are unchanged), but for the
    tree-masked ones, kept whole with their masks."""
    extend_lens: list[int] = []
    context_lens: list[int] = []
    tables = []
    tree = batch.tree_masks or {}
    tree_masks = {}
    for i, (extend_len, context_len, table) in enumerate(zip(
            batch.extend_lens, batch.context_lens, batch.page_tables, strict=True)):
        start = context_len - extend_len
        if i in tree:
            tree_masks[len(extend_lens)] = tree[i]
        step = extend_len if i in tree else max_rows
        for first in range(0, extend_len, step):
            rows = min(step, extend_len - first)
            extend_lens.append(rows)
            context_lens.append(start + first + rows)
            tables.append(table)
    return PagedBatch(extend_lens, context_lens, batch.slot_mapping, tables, tree_masks or None)


class InvariantCpuAttention(CpuPagedAttention):
    name = "cpu_invariant"

    def __init__(self, pool: KVPool, batch: PagedBatch) -> None:
        super().__init__(pool, _pieces(batch, self.max_kernel_rows))
        assert not self.long_items
