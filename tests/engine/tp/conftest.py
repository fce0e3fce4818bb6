"""Fixtures of the tensor-parallel tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.tiny_hf import build_tiny


@pytest.fixture(autouse=True)
def restore_threads() -> Iterator[None]:
    """Rank 0 takes its share of the threads (engine.tp.launch): give the rest back after."""
    num_threads = torch.get_num_threads()
    yield
    torch.set_num_threads(num_threads)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama checkpoint of tests.tiny_hf (4 heads, 2 KV heads, intermediate 96)."""
    return build_tiny("llama", tmp_path_factory.mktemp("tp") / "llama")
