"""Turns scheduled items into one flattened forward over the paged KV pool.

Index tensors (ids, positions, slots) are built on the model's device; page tables stay on the
host, where each backend pads them into one device tensor per step. Decode batches go through
`engine.cuda_graph.StaticDecode` when one is given (CUDA graphs on CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.attention.base import PagedAttentionBackend, PagedBatch
from engine.attention.spec import AttentionSpec
from engine.attention.tree import tree_mask_from_parents
from engine.kv_pool import KVPool
from engine.models.base import AttentionFn, Model
from engine.scheduler.scheduler import ScheduledItem

if TYPE_CHECKING:
    from engine.core import Request
    from engine.cuda_graph import StaticDecode


class LayerGroups:
    """An `AttentionFn` over a pool with a sliding-window page group: sliding layers attend
    through the backend built on the sliding pages' batch, the others through the full one."""

    def __init__(self, full: AttentionFn, sliding: AttentionFn) -> None:
        self.full, self.sliding = full, sliding

    def __call__(self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        return (self.sliding if spec.window is not None else self.full)(spec, q, k, v)


@dataclass(frozen=True)
class StepInputs:
    """One forward's inputs, built from scheduled items (`ModelRunner.build_step`): what
    `forward_step` runs, and what rank 0 broadcasts to tensor-parallel followers (engine.tp).
    `sliding`: the batch in the sliding-window page group (pools with one, else None);
    `layers`: the layers whose residual streams are captured; `decode_path`: as in
    `Model.forward_captured`."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    batch: PagedBatch
    sliding: PagedBatch | None = None
    layers: tuple[int, ...] = ()
    decode_path: bool | None = None


class ModelRunner:
    def __init__(self, model: Model, pool: KVPool,
                 backend: type[PagedAttentionBackend],
                 static_decode: StaticDecode | None = None) -> None:
        self.model = model
        self.pool = pool
        self.backend = backend
        self.page_size = pool.layout.page_size
        self.device = model.device
        self.static_decode = static_decode  # decode batches it accepts bypass `backend`
        # Sliding layers keep their own pages (the pool's second group): their rows are stored
        # and read through each request's sliding-window page table.
        self.has_swa = pool.layout.has_swa

    def build_batch(self, items: Sequence[ScheduledItem]) -> tuple[torch.Tensor, torch.Tensor,
                                                                     PagedBatch]:
        """The batch's ids, positions and full-group batch (`sliding_batch` gives the other)."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        page_tables = []
        tree_masks: dict[int, torch.Tensor] = {}
        for index, item in enumerate(items):
            req = item.request
            end = item.start + item.num_tokens
            input_ids.extend(req.all_ids[item.start : end - item.num_draft])
            input_ids.extend(req.draft_ids[: item.num_draft])
            if item.num_draft and req.draft_parents is not None:
                # A tree: rows keep their own slots (row r at position start + r's slot),
                # but each node sits at its depth and sees only its ancestors.
                parents = [-1] + [p + 1 if p >= 0 else 0
                                  for p in req.draft_parents[: item.num_draft]]
                depths = [0] * len(parents)
                for row in range(1, len(parents)):
                    depths[row] = depths[parents[row]] + 1
                positions.extend(item.start + depth for depth in depths)
                tree_masks[index] = tree_mask_from_parents(parents)
            else:
                positions.extend(range(item.start, end))
            pages = req.page_ids
            slots.extend(pages[p // self.page_size] * self.page_size + p % self.page_size
                         for p in range(item.start, end))
            page_tables.append(torch.tensor(pages[: -(-end // self.page_size)], dtype=torch.long))
        batch = PagedBatch(
            extend_lens=[item.num_tokens for item in items],
            context_lens=[item.start + item.num_tokens for item in items],
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=self.device),
            page_tables=page_tables,
            tree_masks=tree_masks or None,
        )
        return (torch.tensor(input_ids, dtype=torch.long, device=self.device),
                torch.tensor(positions, dtype=torch.long, device=self.device), batch)

    def sliding_batch(self, items: Sequence[ScheduledItem], batch: PagedBatch) -> PagedBatch:
        """`batch` in the sliding group's pages: each request's sliding-window page table (-1
        where given back, all before the window its rows read) and slots."""
        ps = self.page_size
        slots: list[int] = []
        tables = []
        for item in items:
            pages = item.request.swa_page_ids
            end = item.start + item.num_tokens
            slots.extend(pages[p // ps] * ps + p % ps for p in range(item.start, end))
            tables.append(torch.tensor(pages[: -(-end // ps)], dtype=torch.long))
        return PagedBatch(batch.extend_lens, batch.context_lens,
                          torch.tensor(slots, dtype=torch.long, device=self.device), tables,
                          batch.tree_masks)

    def move_rows(self, request: Request, first: int, rows: Sequence[int]) -> None:
        """Copy, in every layer, the KV at positions first + rows[i] - 1 to position first + i
        (an accepted tree path into place; first: the position after the step's first row).
        rows[i] >= i + 1, so no source is overwritten before it is read."""
        moves = [(first - 1 + row, first + i) for i, row in enumerate(rows)
                 if row != i + 1]
        if not moves:
            return
        ps, pages = self.page_size, request.page_ids

        def slot(p: int) -> int:
            return pages[p // ps] * ps + p % ps

        self.copy_rows([slot(a) for a, _ in moves], [slot(b) for _, b in moves])

    def copy_rows(self, src_slots: Sequence[int], dst_slots: Sequence[int]) -> None:
        """Copy, in every layer, the KV at pool slot src_slots[i] to dst_slots[i] (full page
        group; no destination is a later source). Mutates the pool."""
        src = torch.tensor(src_slots, dtype=torch.long, device=self.device)
        dst = torch.tensor(dst_slots, dtype=torch.long, device=self.device)
        for layer in range(len(self.pool.k)):
            for flat in (self.pool.flat_k(layer), self.pool.flat_v(layer)):
                flat.index_copy_(0, dst, flat.index_select(0, src))

    def run(self, items: Sequence[ScheduledItem]) -> torch.Tensor:
        """Forward every scheduled token; returns fp32 CPU logits for the items whose rows complete
        their sequence, in item order: one row each, or 1 + num_draft rows for drafted items."""
        logits, _ = self.run_captured(items, ())
        return logits

    def run_captured(self, items: Sequence[ScheduledItem], layers: Sequence[int]
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`run`, plus the residual streams entering `layers` for every scheduled row in batch
        order (`DecoderModel.forward_captured`; None without layers). A captured forward skips
        the static decode path: CUDA graphs are recorded without the copies.

        Decode and draft-verification rows always take the model's decode path, so a token's
        logits do not depend on what else the step holds: a step of more rows than
        `decode_max_rows` with such rows runs them as their own forward on the decode path,
        and the rest (prefill chunks) as a second one."""
        groups = self._path_groups(items)
        if len(groups) == 1:
            return self._forward(items, layers, groups[0][1])
        logits_of: dict[int, torch.Tensor] = {}
        aux_of: dict[int, torch.Tensor] = {}
        for indices, decode_path in groups:
            logits, aux = self._forward([items[i] for i in indices], layers, decode_path)
            logit_row = aux_row = 0
            for i in indices:
                item = items[i]
                num_logits = 1 + item.num_draft if item.needs_sample else 0
                logits_of[i] = logits[logit_row : logit_row + num_logits]
                logit_row += num_logits
                if aux is not None:
                    aux_of[i] = aux[aux_row : aux_row + item.num_tokens]
                    aux_row += item.num_tokens
        order = range(len(items))
        return (torch.cat([logits_of[i] for i in order]),
                torch.cat([aux_of[i] for i in order]) if aux_of else None)

    def _path_groups(self, items: Sequence[ScheduledItem]
                     ) -> list[tuple[list[int], bool | None]]:
        """(item indices, decode_path) of each forward the step runs."""
        everything = list(range(len(items)))
        limit = self.model.decode_max_rows
        if limit is None or sum(item.num_tokens for item in items) <= limit:
            return [(everything, None)]
        decodes = [i for i, item in enumerate(items) if item.num_tokens == 1 + item.num_draft]
        if not decodes:
            return [(everything, None)]
        if len(decodes) == len(items):
            return [(everything, True)]
        chosen = set(decodes)
        return [(decodes, True), ([i for i in everything if i not in chosen], None)]

    def _forward(self, items: Sequence[ScheduledItem], layers: Sequence[int],
                 decode_path: bool | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over `items`: the sampled rows' logits (item order) and the captures."""
        hidden, aux = self.forward_step(self.build_step(items, layers, decode_path))
        rows: list[int] = []
        offset = 0
        for item in items:
            offset += item.num_tokens
            if item.needs_sample:
                rows.extend(range(offset - 1 - item.num_draft, offset))
        if not rows:
            return torch.empty((0, self.model.config.vocab_size), dtype=torch.float32), aux
        # Sampling, grammar masks and draft acceptance run on the CPU for now, so the sampled
        # rows' fp32 logits come back to the host once per step (a no-op on the CPU).
        sampled = hidden[torch.tensor(rows, device=hidden.device)]
        return self.model.logits(sampled, decode_path).cpu(), aux

    def build_step(self, items: Sequence[ScheduledItem], layers: Sequence[int] = (),
                   decode_path: bool | None = None) -> StepInputs:
        """The inputs of one forward over `items` (reads the requests, mutates nothing)."""
        input_ids, positions, batch = self.build_batch(items)
        sliding = self.sliding_batch(items, batch) if self.has_swa else None
        return StepInputs(input_ids, positions, batch, sliding, tuple(layers), decode_path)

    def forward_step(self, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the model on `step`, storing its KV in the pool: final-normed hidden states
        (N, hidden) and the captured residual streams (None without `step.layers`)."""
        if (not step.layers and self.static_decode is not None
                and self.static_decode.accepts(step.batch)):
            return self.static_decode.forward(step.input_ids, step.positions, step.batch), None
        attention: AttentionFn = self.backend(self.pool, step.batch)
        if step.sliding is not None:
            attention = LayerGroups(attention, self.backend(self.pool, step.sliding))
        return self.model.forward_captured(step.input_ids, step.positions, attention,
                                           step.layers, step.decode_path)
