"""The compiled parts: the CPU paged-attention kernels (engine/attention/csrc/paged_cpu.c for
decodes, extend_cpu.c for extends), the projections straight from a GGUF's codes
(engine/models/csrc/ggml_vec.c: activation rows to int8 and the few-row GEMV; ggml_gemm.c: the
many-row GEMM; ggml_f32.c: the fp32 path and row dequantisation; docs/ggml_kernels.md) and the
elementwise steps of a CPU forward (engine/models/csrc/rowops_cpu.c).

Everything else is in pyproject.toml. pip builds the extensions from source on the machine that
installs them, for that machine's CPU (-march=native, as llama.cpp's GGML_NATIVE does). They
need no torch headers, only a C compiler with OpenMP; without one the install still succeeds
(`optional`) and the engine uses its torch paths, saying so at startup.
"""

from glob import glob

from setuptools import Extension, setup

# No -ffast-math: it would switch the whole process to flush-to-zero.
# Shared by the kernels (MANIFEST.in puts them in the sdist); a changed header rebuilds them.
HEADERS = sorted(glob("engine/csrc/*.h") + glob("engine/attention/csrc/*.h")
                 + glob("engine/models/csrc/*.h"))
COMPILE_ARGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-std=c11"]


def extension(name: str, source: str) -> Extension:
    return Extension(name, sources=[source], include_dirs=["engine/csrc"], depends=HEADERS,
                     extra_compile_args=COMPILE_ARGS, extra_link_args=["-fopenmp"], optional=True)


setup(ext_modules=[
    extension("engine.attention._paged_cpu", "engine/attention/csrc/paged_cpu.c"),
    extension("engine.attention._extend_cpu", "engine/attention/csrc/extend_cpu.c"),
    extension("engine.models._rowops_cpu", "engine/models/csrc/rowops_cpu.c"),
    extension("engine.models._ggml_vec", "engine/models/csrc/ggml_vec.c"),
    extension("engine.models._ggml_gemm", "engine/models/csrc/ggml_gemm.c"),
    extension("engine.models._ggml_f32", "engine/models/csrc/ggml_f32.c"),
])
