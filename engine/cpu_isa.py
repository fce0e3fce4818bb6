"""The CPU class this process runs on, a cap on it for testing lower paths, and what `--dtype
auto` picks for each class with the measurement behind the pick.

Classes, lowest first: "baseline" (x86-64 without AVX2), "avx2" (AVX2 + FMA: AMD Zen 3),
"avx512" (AVX512F/BW/DQ/VL without bf16 dot products), "avx512_bf16" (AVX512-BF16: AMD Zen 4)
and "amx" (AMX-BF16: Intel Xeon since Sapphire Rapids). `RADIXGATE_MAX_CPU_ISA=<class>` caps the
class, and with it every choice made from the flags (`flags()` drops those above the cap), so a
machine with a faster ISA can run the path a slower one takes. The C kernels pick their SIMD at
build time (`-march`); tests build them capped too (`tests/isa_builds.py`), and oneDNN is capped
by its own `ONEDNN_MAX_CPU_ISA`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import InvalidRequest

CAP_ENV = "RADIXGATE_MAX_CPU_ISA"
CLASSES = ("baseline", "avx2", "avx512", "avx512_bf16", "amx")
# The flags that define each class above "baseline" (all of them must be present).
_REQUIRES: dict[str, frozenset[str]] = {
    "avx2": frozenset({"avx2", "fma"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"}),
    "avx512_bf16": frozenset({"avx512_bf16"}),
    "amx": frozenset({"amx_tile", "amx_bf16"}),
}
# Flags a class above the cap brings; dropped from `flags()` under a cap below it.
_BROUGHT = {"avx2": ("avx2", "fma", "avx_vnni"),
            "avx512": ("avx512",),  # every avx512* flag (prefix)
            "avx512_bf16": ("avx512_bf16",),
            "amx": ("amx",)}  # amx_tile, amx_bf16, amx_int8


@dataclass(frozen=True)
class DtypeChoice:
    """What `--dtype auto` runs on a CPU class, and the measurement that decided it."""

    dtype: str
    why: str


# Where bf16 instructions exist, measured with benchmarks.model_speed (the embedded model, 2
# threads); the figures are in the README's benchmark sections.
_AUTO_DTYPE = {
    "baseline": DtypeChoice("fp32", "no bf16 instructions: bf16 would be emulated"),
    "avx2": DtypeChoice("fp32", "no bf16 instructions (Zen 3): bf16 would be converted in "
                                "software"),
    "avx512": DtypeChoice("fp32", "no bf16 dot products: bf16 would be converted in software"),
    "avx512_bf16": DtypeChoice("mixed", "AVX512-BF16 dot products (Zen 4): bf16 projections "
                                        "prefill 349 tok/s at 8000 against fp32's 305, with "
                                        "fp32 norms and attention"),
    "amx": DtypeChoice("mixed", "AMX-BF16 tiles: bf16 projections 2.3x faster than fp32 at "
                                "prefill sizes, with fp32 norms and attention"),
}


# An AVX-512 CPU without bf16 but with VNNI (Intel Ice Lake and Cascade Lake Xeons) runs the
# extends' projections as int8 GEMMs on the GGUF's codes (engine.models.int8_gemm).
_AVX512_VNNI = DtypeChoice("int8", "AVX512-VNNI without bf16 (Ice Lake): int8 projections on "
                                   "the GGUF's codes for extends, fp32 elsewhere")
# AVX2 with AVX-VNNI and no AVX-512 (Intel's E-core Xeons such as Sierra Forest): the same int8
# GEMMs on 256-bit vpdpbusd.
_AVX_VNNI = DtypeChoice("int8", "AVX-VNNI without AVX-512: int8 projections on the GGUF's codes "
                                "for extends prefill 1.55x / 1.29x fp32 at 512 / 2048 tokens "
                                "(AVX2 builds with AVX-VNNI on an AMX Xeon, oneDNN capped to "
                                "AVX2), fp32 elsewhere")


def _cap() -> str | None:
    cap = os.environ.get(CAP_ENV, "").strip().lower()
    if not cap:
        return None
    if cap not in CLASSES:
        raise InvalidRequest(f"{CAP_ENV}={cap!r} is not a CPU class; use one of "
                             f"{', '.join(CLASSES)}")
    return cap


def _detected(cpu_flags: frozenset[str]) -> str:
    found = "baseline"
    for name in CLASSES[1:]:
        if _REQUIRES[name] <= cpu_flags:
            found = name
        else:
            break
    return found


def flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (the words of /proc/cpuinfo; empty where it cannot be read),
    less those of the classes above `RADIXGATE_MAX_CPU_ISA`."""
    try:
        words = frozenset(cpuinfo.read_text().split())
    except OSError:
        return frozenset()
    cap = _cap()
    if cap is None:
        return words
    above = CLASSES[CLASSES.index(cap) + 1 :]
    prefixes = tuple(p for name in above for p in _BROUGHT[name])
    return frozenset(w for w in words if not w.startswith(prefixes))


def cpu_class(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This CPU's class, capped by `RADIXGATE_MAX_CPU_ISA`."""
    return _detected(flags(cpuinfo))


def auto_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, DtypeChoice]:
    """(class, the `--dtype auto` choice for it). "int8" needs the int8 kernel built with VNNI;
    `engine.models.loader.auto_cpu_dtype` checks that."""
    name = cpu_class(cpuinfo)
    if name == "avx512" and "avx512_vnni" in flags(cpuinfo):
        return name, _AVX512_VNNI
    if name == "avx2" and "avx_vnni" in flags(cpuinfo):
        return name, _AVX_VNNI
    return name, _AUTO_DTYPE[name]


def cap_note(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """" (capped by RADIXGATE_MAX_CPU_ISA; the CPU is <class>)" under a cap that lowers the
    class, else ""."""
    cap = _cap()
    if cap is None:
        return ""
    try:
        detected = _detected(frozenset(cpuinfo.read_text().split()))
    except OSError:
        return ""
    if CLASSES.index(detected) <= CLASSES.index(cap):
        return ""
    return f" (capped by {CAP_ENV}; the CPU is {detected})"
