"""The CPU class a figure was measured on, e.g. "AMD EPYC Zen 5 (AVX512-VNNI/BF16, no AMX)".

The same engine ranks differently on a Zen 3 (AVX2 only), a Zen 5 (AVX512-VNNI/BF16) and a Xeon
with AMX, so every target table names the class beside each figure (benchmarks.targets) and
`benchmarks.common.machine_notes` records it.
"""

from __future__ import annotations

import os
from pathlib import Path

# AMD family 25 (0x19) holds Zen 3 and Zen 4; Zen 4 is these model ranges.
_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0x90, 0xB0))


def _cpuinfo(path: Path) -> dict[str, str]:
    """The first processor block of /proc/cpuinfo as {field: value}; empty if unreadable."""
    fields: dict[str, str] = {}
    try:
        text = path.read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _amd_generation(family: int, model: int) -> str | None:
    if family == 23:
        return "Zen 2" if model >= 0x30 else "Zen/Zen+"
    if family == 25:
        return "Zen 4" if any(model in r for r in _ZEN4_MODELS) else "Zen 3"
    if family == 26:
        return "Zen 5"
    return None


def _isa(flags: set[str]) -> str:
    if "avx512f" in flags:
        extras = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"))
                  if flag in flags]
        isa = "AVX512" + ("-" + "/".join(extras) if extras else "")
    elif "avx2" in flags:
        isa = "AVX2" + ("+AVX-VNNI" if "avx_vnni" in flags else "") + ", no AVX512"
    else:
        isa = "no AVX2"
    amx = [name for flag, name in (("amx_int8", "INT8"), ("amx_bf16", "BF16")) if flag in flags]
    return isa + (f", AMX-{'/'.join(amx)}" if amx else ", no AMX")


def cpu_class(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """E.g. "AMD EPYC Zen 5 (AVX512-VNNI/BF16, no AMX)": the model name, the AMD core
    generation from family/model, and the ISA the kernels can use (from the hardware flags,
    with a note when `RADIXGATE_MAX_CPU_ISA` caps what the engine uses)."""
    info = _cpuinfo(cpuinfo)
    name = " ".join(info.get("model name", "unknown CPU").replace("(R)", "").replace(
        "(TM)", "").split())
    if info.get("vendor_id") == "AuthenticAMD" and "Zen" not in name:
        try:
            gen = _amd_generation(int(info.get("cpu family", "0")), int(info.get("model", "0")))
        except ValueError:
            gen = None
        name += f" {gen}" if gen else f" (family {info.get('cpu family')})"
    label = f"{name} ({_isa(set(info.get('flags', '').split()))})"
    cap = os.environ.get("RADIXGATE_MAX_CPU_ISA", "").strip()
    return label + (f" [engine capped at {cap}]" if cap else "")
