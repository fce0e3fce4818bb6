"""The C extensions built for a lower CPU class than this machine's, so that its tests can run
the SIMD path a slower CPU takes (setup.py builds them with -march=native: one path per
machine).

`build(isa, folder)` compiles each extension with that class's -march into `folder`, as
`<module name>.so`; the pytest plugin `tests.isa_override` then loads them in place of the
installed ones when `RADIXGATE_TEST_EXT_DIR` names the folder.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {
    "engine.attention._paged_cpu": "engine/attention/csrc/paged_cpu.c",
    "engine.attention._extend_cpu": "engine/attention/csrc/extend_cpu.c",
    "engine.models._rowops_cpu": "engine/models/csrc/rowops_cpu.c",
    "engine.models._ggml_gemm": "engine/models/csrc/ggml_gemm.c",
    "engine.models._ggml_vec": "engine/models/csrc/ggml_vec.c",
    "engine.models._ggml_f32": "engine/models/csrc/ggml_f32.c",
}
# -march levels (gcc's x86-64 micro-architecture levels): v3 has AVX2 and FMA, no AVX-512;
# v2 has SSE4.2 only, so the kernels take their scalar (auto-vectorised) path.
MARCH = {"avx2": "x86-64-v3", "baseline": "x86-64-v2"}
# What each build's simd() must report.
SIMD = {"avx2": "avx2", "baseline": "scalar"}
# oneDNN's own cap for the same class (its ONEDNN_MAX_CPU_ISA names).
ONEDNN_ISA = {"avx2": "AVX2", "baseline": "SSE41"}


def compiler() -> str | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc") or shutil.which("gcc")


def build(isa: str, folder: Path) -> None:
    """Compile every extension for `isa` into `folder`. Raises CalledProcessError with the
    compiler's output on failure."""
    cc = compiler()
    if cc is None:
        raise FileNotFoundError("no C compiler on PATH")
    include = sysconfig.get_paths()["include"]
    folder.mkdir(parents=True, exist_ok=True)
    for module, source in SOURCES.items():
        subprocess.run(
            [cc, "-O3", f"-march={MARCH[isa]}", "-fopenmp", "-fno-math-errno", "-std=c11",
             "-shared", "-fPIC", f"-I{include}", f"-I{ROOT / 'engine/csrc'}", str(ROOT / source),
             "-o", str(folder / f"{module}.so")],
            check=True, capture_output=True, text=True, timeout=300)
