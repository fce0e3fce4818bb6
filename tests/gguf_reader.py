"""transformers parses a GGUF with gguf-py's `GGUFReader`, which spends seconds in numpy.memmap
slicing over a large vocabulary's strings (~4.7 s for SmolLM2's 49k, ~25 s for Gemma's 262k);
over an in-memory copy of the file the same reader takes well under a second. Tests that load
a GGUF into transformers parse it that way, and once per file."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest


@contextmanager
def in_memory_gguf_reader() -> Iterator[None]:
    """While active, `gguf.GGUFReader(path)` reads the file into memory first, and a file read
    once is not parsed again. The reader is gguf-py's own; only its buffer differs."""
    readers: dict[str, gguf.GGUFReader] = {}
    original = gguf.GGUFReader

    def in_memory(path: Any, mode: str = "r", **_: Any) -> np.ndarray:
        return np.fromfile(path, dtype=np.uint8)

    def reader(path: Any, mode: str = "r") -> gguf.GGUFReader:
        key = str(Path(path).resolve())
        if key not in readers:
            with pytest.MonkeyPatch.context() as patch:  # only while this one is constructed
                patch.setattr(np, "memmap", in_memory)
                readers[key] = original(path)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", reader)
        yield
