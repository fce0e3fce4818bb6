"""pytest plugin (`-p tests.isa_override`): with `RADIXGATE_TEST_EXT_DIR` set, the C extensions
built there (`tests.isa_builds`) are loaded in place of the installed ones, before any test
imports the engine; the summary says which SIMD path each ran."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any


def _load_overrides() -> None:
    folder = os.environ.get("RADIXGATE_TEST_EXT_DIR")
    if not folder:
        return
    for path in sorted(Path(folder).glob("*.so")):
        name = path.name.removesuffix(".so")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module


_load_overrides()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from engine.native import kernel_simd

    terminalreporter.write_line(f"radixgate C kernels: {kernel_simd()}")
