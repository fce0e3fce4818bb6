"""Builds the engine's speculator from the `spec` setting (`SPEC_CHOICES`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.attention.tree import MAX_TREE_ROWS
from engine.errors import InvalidRequest
from engine.spec.drafter import Drafter
from engine.spec.eagle3_tree import TreeShape
from engine.spec.gate import DraftGateConfig
from engine.spec.speculator import Speculator
from engine.spec.suffix_drafter import SuffixDrafter, SuffixDrafterConfig

if TYPE_CHECKING:
    from engine.models.loader import LoadedModel

SPEC_CHOICES = ("none", "suffix", "draft:<model path>", "eagle3:<head folder>",
                "eagle3+suffix:<head folder>")


def make_speculator(spec: str, max_draft_len: int, target: LoadedModel,
                    draft_backoff: int = 16, draft_topk: int = 1,
                    draft_steps: int = 0) -> Speculator | None:
    """`draft_backoff`: the most decode steps a request skips drafting after misses.
    `draft_topk` > 1: EAGLE-3 heads draft trees of that width and `draft_steps` depth (0:
    max_draft_len); other drafters refuse it."""
    if spec == "none":
        return None
    if max_draft_len < 1:
        raise InvalidRequest(f"max_draft_len must be >= 1, got {max_draft_len}")
    if draft_backoff < 0:
        raise InvalidRequest(f"draft_backoff must be >= 0, got {draft_backoff}")
    if draft_topk < 1 or draft_steps < 0:
        raise InvalidRequest(f"draft_topk must be >= 1 and draft_steps >= 0, got "
                             f"{draft_topk} and {draft_steps}")
    if draft_topk > MAX_TREE_ROWS - 1 or max_draft_len > MAX_TREE_ROWS - 1:
        raise InvalidRequest(f"a draft verifies at most {MAX_TREE_ROWS - 1} tokens; got "
                             f"max_draft_len {max_draft_len}, draft_topk {draft_topk}")
    tree = TreeShape(draft_topk, draft_steps or max_draft_len) if draft_topk > 1 else None
    if tree is not None and not spec.startswith(("eagle3:", "eagle3+suffix:")):
        raise InvalidRequest(f"--draft-topk {draft_topk} drafts trees with an EAGLE-3 head; "
                             f"spec '{spec}' drafts chains: use --draft-topk 1")
    gate = DraftGateConfig(max_skip=draft_backoff)
    if spec == "suffix":
        return Speculator(SuffixDrafter(SuffixDrafterConfig(max_draft_len=max_draft_len)),
                          max_draft_len, gate)
    if spec.startswith("draft:"):
        from engine.spec.model_drafter import ModelDrafter

        return Speculator(ModelDrafter.from_path(spec.removeprefix("draft:"), target,
                                                 max_draft_len), max_draft_len, gate)
    if spec.startswith(("eagle3:", "eagle3+suffix:")):
        kind, _, path = spec.partition(":")
        return Speculator(_eagle3_drafter(kind, path, target, max_draft_len, tree, gate),
                          max_draft_len, gate)
    raise InvalidRequest(f"speculative mode '{spec}' is unknown; choose from {SPEC_CHOICES}")


def _eagle3_drafter(kind: str, path: str, target: LoadedModel, max_draft_len: int,
                    tree: TreeShape | None, gate: DraftGateConfig) -> Drafter:
    """The head in `path` drafting alone ("eagle3") or with the suffix drafter taking long
    matches ("eagle3+suffix"). Raises InvalidDraftHead when the head does not fit `target`."""
    from engine.spec.eagle3_drafter import Eagle3Drafter
    from engine.spec.eagle3_head import load_eagle3_head
    from engine.spec.hybrid_drafter import HybridDrafter

    model = target.model
    # The head's weights are read in full at every draft step: in the target's lower
    # precision where it has one (bf16 on CPUs with bf16 instructions: a draft step 1.5-2x
    # faster than fp32), else fp32. Drafts never change the output, only their cost.
    mixed = getattr(model, "mixed", None)
    dtype = mixed.dtype if mixed is not None else torch.float32
    head = load_eagle3_head(path, target_config=model.config, target_embed=model.weights.embed,
                            dtype=dtype)
    eagle = Eagle3Drafter(head, max_draft_len, tree=tree)
    if kind == "eagle3":
        return eagle
    return HybridDrafter(SuffixDrafter(SuffixDrafterConfig(max_draft_len=max_draft_len)), eagle,
                         gate=gate)
