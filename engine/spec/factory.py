"""Builds the engine's speculator from the `spec` setting: "none", "suffix" or "draft:<path>"."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import InvalidRequest
from engine.spec.speculator import Speculator
from engine.spec.suffix_drafter import SuffixDrafter, SuffixDrafterConfig

if TYPE_CHECKING:
    from engine.models.loader import LoadedModel

SPEC_CHOICES = ("none", "suffix", "draft:<model path>")


def make_speculator(spec: str, max_draft_len: int, target: LoadedModel) -> Speculator | None:
    if spec == "none":
        return None
    if max_draft_len < 1:
        raise InvalidRequest(f"max_draft_len must be >= 1, got {max_draft_len}")
    if spec == "suffix":
        return Speculator(SuffixDrafter(SuffixDrafterConfig(max_draft_len=max_draft_len)),
                          max_draft_len)
    if spec.startswith("draft:"):
        from engine.spec.model_drafter import ModelDrafter

        return Speculator(ModelDrafter.from_path(spec.removeprefix("draft:"), target,
                                                 max_draft_len), max_draft_len)
    raise InvalidRequest(f"speculative mode '{spec}' is unknown; choose from {SPEC_CHOICES}")
