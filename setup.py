"""The compiled parts: the CPU paged-attention kernels (engine/attention/csrc/paged_cpu.c for
decodes, extend_cpu.c for extends), the linear layers over packed GGUF weights
(engine/models/csrc/qlinear_cpu.c), their int8 GEMM for extends
(engine/models/csrc/qgemm_i8_cpu.c) and the elementwise steps of a decode-sized forward
(engine/models/csrc/rowops_cpu.c).

Everything else is in pyproject.toml. pip builds the extensions from source on the machine that
installs them, for that machine's CPU (-march=native, as llama.cpp's GGML_NATIVE does). They
need no torch headers, only a C compiler with OpenMP; without one the install still succeeds
(`optional`) and the engine uses its torch paths, saying so at startup.
"""

from setuptools import Extension, setup

# No -ffast-math: it would switch the whole process to flush-to-zero.
# Shared by the kernels (MANIFEST.in puts them in the sdist).
HEADERS = ["engine/csrc/simd_exp.h", "engine/csrc/bf16.h", "engine/attention/csrc/paged_avx512.h",
           "engine/attention/csrc/extend_avx512.h", "engine/attention/csrc/extend_avx2.h",
           "engine/attention/csrc/extend_amx.h", "engine/attention/csrc/extend_bf16.h",
           "engine/attention/csrc/extend_common.h", "engine/attention/csrc/paged_rows.h"]
COMPILE_ARGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-std=c11"]


def extension(name: str, source: str) -> Extension:
    return Extension(name, sources=[source], include_dirs=["engine/csrc"], depends=HEADERS,
                     extra_compile_args=COMPILE_ARGS, extra_link_args=["-fopenmp"], optional=True)


setup(ext_modules=[
    extension("engine.attention._paged_cpu", "engine/attention/csrc/paged_cpu.c"),
    extension("engine.attention._extend_cpu", "engine/attention/csrc/extend_cpu.c"),
    extension("engine.models._qlinear_cpu", "engine/models/csrc/qlinear_cpu.c"),
    extension("engine.models._rowops_cpu", "engine/models/csrc/rowops_cpu.c"),
    extension("engine.models._qgemm_i8_cpu", "engine/models/csrc/qgemm_i8_cpu.c"),
])
