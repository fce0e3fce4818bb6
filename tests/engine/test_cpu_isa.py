"""CPU classes from the flags, the RADIXGATE_MAX_CPU_ISA cap, and what --dtype auto picks."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import cpu_isa
from engine.errors import InvalidRequest
from engine.models.loader import cpu_has_bf16, default_dtype

ZEN3 = "fpu sse4_2 avx avx2 fma"
ZEN4 = ZEN3 + " avx512f avx512bw avx512dq avx512vl avx512_vnni avx512_bf16"
SAPPHIRE_RAPIDS = ZEN4 + " amx_tile amx_bf16 amx_int8"


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    return path


@pytest.mark.parametrize(("flags", "name", "dtype"), [
    ("fpu sse4_2", "baseline", "int8"), (ZEN3, "avx2", "int8"),
    (ZEN3 + " avx512f avx512bw avx512dq avx512vl", "avx512", "int8"),
    (ZEN4, "avx512_bf16", "int8"), (SAPPHIRE_RAPIDS, "amx", "int8")])
def test_class_and_auto_dtype_follow_the_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               flags: str, name: str, dtype: str) -> None:
    monkeypatch.delenv(cpu_isa.CAP_ENV, raising=False)
    cpuinfo = _cpuinfo(tmp_path, flags)
    found, choice = cpu_isa.auto_dtype(cpuinfo)
    assert (found, choice.dtype) == (name, dtype)
    assert choice.why
    assert cpu_has_bf16(cpuinfo) == (name in ("avx512_bf16", "amx"))


def test_a_cap_lowers_the_class_and_drops_the_flags_above_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpuinfo = _cpuinfo(tmp_path, SAPPHIRE_RAPIDS)
    monkeypatch.setenv(cpu_isa.CAP_ENV, "avx2")
    assert cpu_isa.cpu_class(cpuinfo) == "avx2"
    assert not any(f.startswith(("avx512", "amx")) for f in cpu_isa.flags(cpuinfo))
    assert not cpu_has_bf16(cpuinfo)
    assert "the CPU is amx" in cpu_isa.cap_note(cpuinfo)
    monkeypatch.setenv(cpu_isa.CAP_ENV, "avx512_bf16")
    assert cpu_isa.cpu_class(cpuinfo) == "avx512_bf16"
    assert "avx512_vnni" in cpu_isa.flags(cpuinfo) and "amx_tile" not in cpu_isa.flags(cpuinfo)
    # A cap above the CPU changes nothing.
    monkeypatch.setenv(cpu_isa.CAP_ENV, "amx")
    assert cpu_isa.cpu_class(_cpuinfo(tmp_path, ZEN3)) == "avx2"
    assert cpu_isa.cap_note(_cpuinfo(tmp_path, ZEN3)) == ""


def test_an_unknown_cap_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_isa.CAP_ENV, "avx1024")
    with pytest.raises(InvalidRequest, match="avx1024.*baseline, avx2"):
        cpu_isa.cpu_class()


def test_cuda_is_bf16_whatever_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_isa.CAP_ENV, "baseline")
    assert default_dtype("cuda") == "bf16"
    assert default_dtype("cpu") in ("int8", "fp32")  # fp32 only where the kernels are unbuilt
