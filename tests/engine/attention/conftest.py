"""Triton kernels run on CPU under the interpreter, which must be on before triton is imported."""

from __future__ import annotations

import os

# Set at collection, before any test module of this package imports triton. Respect an
# explicit value (TRITON_INTERPRET=0 on a CUDA machine compiles the kernels instead).
os.environ.setdefault("TRITON_INTERPRET", "1")
