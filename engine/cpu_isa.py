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


# GGUF codes run on the int8 path on every class (engine.models.ggml_weight: VNNI, AVX2 maddubs
# or scalar), with the KV pool and everything else in fp32. A bf16 pool ("mixed") halves the KV
# memory but costs accuracy: on Qwen2.5-Coder-1.5B (tests/e2e/test_qwen_real.py's 300-token code
# prompt, AMD EPYC Zen 4, 2026-12-07) it flips the top-1 token against fp32 on 2.0% of positions
# where an fp32 pool flips 0.7% (mean KL 0.0009 and 0.0008), and the default must stay within 1%.
_KV_FP32 = "the KV pool fp32 (a bf16 pool flips top-1 on 2.0% of the 1.5B's positions, fp32 0.7%)"
_AUTO_DTYPE = {
    "baseline": DtypeChoice("int8", f"GGUF codes on the int8 path (scalar), {_KV_FP32}"),
    "avx2": DtypeChoice("int8", f"GGUF codes on the int8 path (AVX2 maddubs, or AVX-VNNI), "
                                f"{_KV_FP32}"),
    "avx512": DtypeChoice("int8", f"GGUF codes on the int8 path (AVX512-VNNI), {_KV_FP32}"),
    "avx512_bf16": DtypeChoice("int8", f"GGUF codes on the int8 path (AVX512-VNNI), {_KV_FP32}; "
                                       "--dtype mixed gives dense checkpoints bf16 projections"),
    "amx": DtypeChoice("int8", f"GGUF codes on the int8 path (AVX512-VNNI), {_KV_FP32}; --dtype "
                               "mixed gives dense checkpoints bf16 projections on AMX tiles"),
}


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
    """(class, the `--dtype auto` choice for it). The int8 path needs its kernels built;
    `engine.models.loader.auto_cpu_dtype` checks that."""
    name = cpu_class(cpuinfo)
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
