"""The one compiled part: the CPU paged-attention kernel (engine/attention/csrc/paged_cpu.c).

Everything else is in pyproject.toml. pip builds the extension from source on the machine that
installs it, for that machine's CPU (-march=native, as llama.cpp's GGML_NATIVE does). It needs
no torch headers, only a C compiler with OpenMP; without one the install still succeeds
(`optional`) and the engine uses its torch attention path, saying so at startup.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "engine.attention._paged_cpu",
    sources=["engine/attention/csrc/paged_cpu.c"],
    # No -ffast-math: it would switch the whole process to flush-to-zero.
    extra_compile_args=["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-std=c11"],
    extra_link_args=["-fopenmp"],
    optional=True,
)])
