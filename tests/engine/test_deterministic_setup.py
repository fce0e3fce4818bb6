"""What `--deterministic` sets up, and what it says it cannot make invariant."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from engine.attention.base import PagedBatch
from engine.attention.cpu_invariant import InvariantCpuAttention, _pieces
from engine.deterministic import dense_projections, deterministic_setup
from engine.errors import InvalidRequest
from engine.models.loader import LoadedModel, load_model
from engine.models.weights import PackedWeights
from tests.tiny_hf import build_tiny


def test_long_extends_become_pieces_of_kernel_rows() -> None:
    table = torch.arange(8)
    batch = PagedBatch([1, 40], [30, 100], torch.arange(41), [table, table])
    pieces = _pieces(batch, 16)
    assert pieces.extend_lens == [1, 16, 16, 8]
    assert pieces.context_lens == [30, 76, 92, 100]
    assert all(t is table for t in pieces.page_tables)


def test_dense_projections_are_named_at_start(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    # An HF checkpoint has no GGUF codes: every projection stays dense.
    model = load_model(str(build_tiny("gemma3", tmp_path)), "fp32", show_progress=False)
    packed = model.model.packed
    assert isinstance(packed, PackedWeights)
    names = dense_projections(packed)
    assert "layer 0 qkv" in names and "lm_head" in names
    with caplog.at_level(logging.WARNING, logger="engine.deterministic"):
        loaded, backend = deterministic_setup(model, "cpu")
    assert backend is InvariantCpuAttention
    assert loaded.model.packed is not None and loaded.model.packed.max_rows > 1 << 30
    assert f"{len(names)} projections are dense (layer 0 qkv" in caplog.text


def test_it_needs_the_cpu(tiny: LoadedModel) -> None:
    with pytest.raises(InvalidRequest, match="CPU"):
        deterministic_setup(tiny, "cuda")
