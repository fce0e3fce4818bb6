"""The attention of `--deterministic`: the "cpu" backend with every long extend on the C extend
kernel, whatever `cpu_extend.extend_choice` picks for speed. Both C kernels compute a row as
csrc/row_math.h says (its keys in splits and tiles on a grid of absolute positions, merged in a
fixed order, the same sums in the same order), so every row gets the bits a decode at its
position gives it, whatever else shares the step. The "cpu" backend itself does the same where
that costs at most 5%; this one also where it costs more: a bf16 pool on Xeons with AMX tiles,
builds without AVX2.

Where the C extend kernel cannot take the layer (not built, or head_dim not a multiple of 8), a
long extend is cut into pieces of at most 16 rows instead, each a sequence of its own for the
decode kernel (the same pages, its context ending at the piece's last row): the same bits,
slower for long prefills.

A draft tree's sequence (`PagedBatch.tree_masks`, at most 63 rows) is never cut: a later piece
would see the earlier pieces' rows as its prefix, not through the mask. It goes to the decode
kernel whole, where each row's bits depend only on its own mask and position.
"""

from __future__ import annotations

from engine.attention.base import PagedBatch
from engine.attention.cpu_extend import c_kernel_takes
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
    extend_path = "c"

    def __init__(self, pool: KVPool, batch: PagedBatch) -> None:
        if not c_kernel_takes(pool.k[0].shape[-1]):
            batch = _pieces(batch, self.max_kernel_rows)
        super().__init__(pool, batch)
        assert not self.long_items or self.extend_index is not None
