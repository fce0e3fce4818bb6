"""Fixtures shared by the model tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest


@pytest.fixture
def shared_reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Parse each GGUF once per test, from memory. `from_pretrained` parses a GGUF twice (config,
    then weights), and a parse takes ~4.7 s, nearly all of it numpy.memmap slicing overhead
    over SmolLM2's 98k tokenizer strings; over a plain in-memory array it takes well under 1 s.
    The reader is gguf-py's own, only its buffer differs."""
    readers: dict[str, gguf.GGUFReader] = {}
    original = gguf.GGUFReader

    def in_memory(path: Any, mode: str = "r", **_: Any) -> np.ndarray:
        return np.fromfile(path, dtype=np.uint8)

    def reader(path: Any, mode: str = "r") -> gguf.GGUFReader:
        key = str(Path(path).resolve())
        if key not in readers:
            with monkeypatch.context() as patch:  # only while this reader is constructed
                patch.setattr(np, "memmap", in_memory)
                readers[key] = original(path)
        return readers[key]

    monkeypatch.setattr(gguf, "GGUFReader", reader)
    yield
