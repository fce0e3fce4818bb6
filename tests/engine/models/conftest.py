"""Fixtures shared by the model tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gguf_reader import in_memory_gguf_reader


@pytest.fixture
def shared_reader() -> Iterator[None]:
    """transformers parses each GGUF once per test, from memory (tests/gguf_reader.py)."""
    with in_memory_gguf_reader():
        yield
