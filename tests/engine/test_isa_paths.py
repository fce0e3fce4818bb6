"""Every SIMD path a CPU class selects passes the kernel tests on this machine: the C
extensions are rebuilt for the lower classes (AVX2 as on Zen 3, and no AVX2 at all), oneDNN and
the engine's own flag-based choices are capped to the same class, and the kernel and model
tests run against them in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import cpu_isa
from tests import isa_builds

KERNEL_TESTS = (
    "tests/engine/attention/test_cpu_paged.py",
    "tests/engine/attention/test_cpu_extend.py",
    "tests/engine/attention/test_cpu_paged_spec.py",
    "tests/engine/models/test_rowops.py",
    # The GGUF kernels' own tests (test_ggml_vec/gemm/f32.py) compile and check every build
    # (native, AVX-VNNI, AVX2 = x86-64-v3, scalar = x86-64-v2) in the native run; here the model
    # runs on the capped builds end to end.
    "tests/engine/models/test_ggml_model.py",
    "tests/engine/models/test_onednn.py",
    "tests/engine/test_mixed_precision.py",
)
# The --deterministic test on the AVX2 build only: every forward of it takes the decode kernels,
# and the no-AVX2 build's scalar ones took 10 minutes of it on 2 Ice Lake cores (the kernel
# tests above cover that build's paths).
EXTRA_TESTS = {"avx2": ("tests/e2e/test_deterministic.py",), "baseline": ()}


@pytest.mark.parametrize("isa", ["avx2", "baseline"])
def test_a_lower_cpu_class_passes_the_kernel_tests(isa: str, tmp_path: Path) -> None:
    if cpu_isa.CLASSES.index(cpu_isa.cpu_class()) < cpu_isa.CLASSES.index(isa):
        pytest.skip(f"this CPU is below {isa}")
    if isa_builds.compiler() is None:
        pytest.skip("no C compiler")
    isa_builds.build(isa, tmp_path)
    env = {**os.environ, "RADIXGATE_TEST_EXT_DIR": str(tmp_path), cpu_isa.CAP_ENV: isa,
           "ONEDNN_MAX_CPU_ISA": isa_builds.ONEDNN_ISA[isa]}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.isa_override", "-p",
         "no:cacheprovider", "-m", "not slow", *KERNEL_TESTS, *EXTRA_TESTS[isa]],
        cwd=isa_builds.ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    simd = isa_builds.SIMD[isa]
    extend = {"avx2": "avx2", "baseline": "portable"}[isa]
    assert (f"radixgate C kernels: attention {simd}, extend attention {extend}, int8 gemv "
            f"{simd}, int8 gemm {simd}, fp32 codes {simd}") in done.stdout, tail
