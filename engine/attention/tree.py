"""Tree attention masks (EAGLE-3 tree verification): which of a step's rows each row sees.

A tree verification step appends T rows to a sequence whose cached prefix holds
context_len - T tokens: the last verified token, then the draft tree's nodes in an order where
every node comes after its parent. Under a tree mask, row t sees the whole prefix and, among the
step's rows, exactly those whose bit is set in its mask: its ancestors and itself, so that it
attends as a sequential decode of its own root-to-node path would. One sequence's mask is an
int64 CPU tensor (T,); bit j of entry t set means row t sees row j:

    parents [-1, 0, 0, 1]   (row 0 the root, rows 1 and 2 its children, row 3 a child of 1)
    masks   [0b0001, 0b0011, 0b0101, 0b1011]

A causal chain (each row the child of the one before) has mask[t] = 2^(t + 1) - 1: the same
attention as no mask. T <= 63 (bit 63 is int64's sign bit).

Positions are the engine's affair (each node gets context_len - T + depth through the model's
positions tensor). Attention reads no position except for a sliding window, where a node's
window would have to be counted along its path, not in row order; no backend writes that, so a
layer with a window refuses tree masks (`check_tree_spec`) rather than compute it wrongly.
Sinks and softcap do not depend on the mask and are computed as in any other row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from engine.attention.spec import AttentionSpec

MAX_TREE_ROWS = 63


def chain_mask(n: int) -> torch.Tensor:
    """The mask of n rows in a causal chain, (2^(t + 1) - 1 for row t): int64 (n,) CPU.
    Raises ValueError unless 1 <= n <= 63."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TREE_ROWS:
        raise ValueError(f"a tree mask covers 1 to {MAX_TREE_ROWS} rows, got {n!r}")
    return (1 << torch.arange(1, n + 1, dtype=torch.int64)) - 1


def tree_mask_from_parents(parents: Sequence[int]) -> torch.Tensor:
    """The mask of a tree given each row's parent: parents[t] is the index of row t's parent,
    which comes before it (parents[t] < t), or -1 for a root (row 0 always; a later -1 starts
    another root, which sees only the prefix and itself). Row t sees itself and its ancestors.
    -> int64 (len(parents),) CPU. Raises ValueError for a parent out of [-1, t) or more than
    63 rows."""
    n = len(parents)
    if not 1 <= n <= MAX_TREE_ROWS:
        raise ValueError(f"a tree mask covers 1 to {MAX_TREE_ROWS} rows, got {n}")
    rows: list[int] = []
    for t, parent in enumerate(parents):
        if isinstance(parent, bool) or not isinstance(parent, int) or not -1 <= parent < t:
            raise ValueError(f"tree row {t}: parent must be -1 (a root) or a row before it, "
                             f"got {parent!r}")
        rows.append((1 << t) | (rows[parent] if parent >= 0 else 0))
    return torch.tensor(rows, dtype=torch.int64)


def check_tree_masks(tree_masks: Mapping[int, torch.Tensor], extend_lens: Sequence[int]) -> None:
    """Raises ValueError unless every entry is a valid mask for its sequence: key a sequence
    index of the batch, value an int64 CPU tensor (extend_lens[key],) with extend_lens[key] <=
    63, every row's own bit set and no bit above it (a row sees no later row). Reads only the
    masked sequences' masks (a few small tensors a step)."""
    for i, mask in tree_masks.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(extend_lens):
            raise ValueError(f"tree mask key {i!r} is not a sequence of this batch of "
                             f"{len(extend_lens)}")
        t_len = extend_lens[i]
        if not 1 <= t_len <= MAX_TREE_ROWS:
            raise ValueError(f"tree mask of sequence {i}: a tree covers 1 to {MAX_TREE_ROWS} "
                             f"rows, this sequence extends by {t_len}")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.int64:
            what = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"tree mask of sequence {i} must be an int64 tensor, got {what}")
        if mask.device.type != "cpu" or tuple(mask.shape) != (t_len,):
            raise ValueError(f"tree mask of sequence {i} must be a CPU tensor of shape "
                             f"({t_len},) (one entry per row), got {tuple(mask.shape)} on "
                             f"{mask.device}")
        rows = torch.arange(t_len, dtype=torch.int64)
        no_self = ((mask >> rows) & 1) == 0
        if no_self.any():
            t = int(no_self.nonzero()[0])
            raise ValueError(f"tree mask of sequence {i}: row {t} does not see itself "
                             f"(bit {t} of {int(mask[t]):#x} is clear)")
        # Arithmetic shift: a negative entry (bit 63 set) stays nonzero, as it should.
        later = (mask >> (rows + 1)) != 0
        if later.any():
            t = int(later.nonzero()[0])
            raise ValueError(f"tree mask of sequence {i}: row {t} sees a later row "
                             f"({int(mask[t]):#x} has bits above bit {t}); a node's ancestors "
                             "must come before it in row order")


def check_tree_spec(spec: AttentionSpec) -> None:
    """Raises ValueError when layer `spec` cannot take tree masks: one with a sliding window
    (see the module docstring)."""
    if spec.window is not None:
        raise ValueError(f"layer {spec.layer_idx}: tree attention masks are not supported on a "
                         f"layer with a sliding window ({spec.window}); verify drafts as a "
                         "chain (no tree_masks) for this model")


def tree_visible(mask: torch.Tensor, context_len: int) -> torch.Tensor:
    """(T, context_len) bool, T = len(mask): row t sees key position p. Every position of the
    prefix (p < context_len - T), and the step's row j (at context_len - T + j) iff bit j of
    mask[t]. On the mask's device."""
    t_len = mask.shape[0]
    visible = torch.ones(t_len, context_len, dtype=torch.bool, device=mask.device)
    bits = mask.unsqueeze(1) >> torch.arange(t_len, device=mask.device)
    visible[:, context_len - t_len:] = (bits & 1).bool()
    return visible


def row_masks(tree_masks: Mapping[int, torch.Tensor] | None, extend_lens: Sequence[int],
              items: Iterable[int]) -> torch.Tensor | None:
    """One int64 entry per row of the sequences `items`, in order (a kernel's per-row mask
    argument): the sequence's tree mask, or 0 (causal) for a sequence without one. None when
    none of `items` has a mask of more than one row (a one-row mask is the causal one)."""
    items = list(items)
    if not tree_masks or all(tree_masks.get(i) is None or extend_lens[i] == 1 for i in items):
        return None
    parts = [tree_masks[i] if i in tree_masks else torch.zeros(extend_lens[i], dtype=torch.int64)
             for i in items]
    return torch.cat(parts).contiguous()
