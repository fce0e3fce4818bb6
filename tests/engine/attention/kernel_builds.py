"""One C kernel built for a chosen -march, so a test can run the SIMD path another CPU class
takes (setup.py builds the installed one with -march=native). Built once per source, flags and
Python into a cache under the temp dir (about a second each) and loaded from there."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
INCLUDES = (ROOT / "engine/csrc", ROOT / "engine/attention/csrc")
# setup.py's COMPILE_ARGS with -march left to the variant.
FLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-std=c11", "-shared", "-fPIC")
# What each -march needs of this CPU (torch's capability names it by its widest vectors), and
# the /proc/cpuinfo flag beyond that.
NEEDS = {"x86-64-v3": ("AVX2", "AVX512"), "icelake-server": ("AVX512",),
         "cooperlake": ("AVX512",)}
NEEDS_FLAG = {"cooperlake": "avx512_bf16"}


def _has_flag(flag: str) -> bool:
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def cannot_run(march: str, extra: tuple[str, ...] = (),
               needs_flag: str | None = None) -> str | None:
    """Why this machine cannot run code built with -march=`march` (and `extra`, and where this
    CPU lacks `needs_flag`), or None when it can."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return "needs an x86-64 machine"
    if ((march in NEEDS and torch.backends.cpu.get_cpu_capability() not in NEEDS[march])
            or (march in NEEDS_FLAG and not _has_flag(NEEDS_FLAG[march]))
            or (needs_flag is not None and not _has_flag(needs_flag))):
        return f"this CPU cannot run -march={march} {' '.join(extra)}"
    return None


@functools.cache
def build_variant(source: Path, march: str, extra: tuple[str, ...] = (),
                  needs_flag: str | None = None) -> ModuleType | str:
    """The kernel in `source` (its module is "_" + its stem) built with -march=`march` and the
    `extra` compiler flags, or why it could not be (also when this CPU lacks `needs_flag`)."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    why = cannot_run(march, extra, needs_flag)
    if why is not None or compiler is None:
        return why or "needs a C compiler"
    name = f"_{source.stem}"
    headers = sorted(p for d in INCLUDES for p in d.glob("*.h"))
    digest = hashlib.sha256(f"{march} {extra} {FLAGS} {sys.version}".encode())
    for path in (source, *headers):
        digest.update(path.read_bytes())
    folder = Path(tempfile.gettempdir()) / f"radixgate{name}-{march}-{digest.hexdigest()[:16]}"
    library = folder / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not library.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"build-{os.getpid()}.so"  # renamed into place: parallel runs race
        cmd = [compiler, *FLAGS, f"-march={march}", *extra, *(f"-I{d}" for d in INCLUDES),
               f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(partial)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            return f"{' '.join(cmd)} failed: {done.stderr[-2000:]}"
        os.replace(partial, library)
    # The name's last part must be the module's own (PyInit_<name>).
    spec = importlib.util.spec_from_file_location(f"{march.replace('-', '_')}.{name}", library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def strict_build(source: Path, march: str) -> ModuleType:
    """`source` built from the working tree with -march=`march` ("native" included): skips the
    test only where this CPU cannot run that build; a build that does not compile (or no
    compiler) fails it."""
    why = cannot_run(march)
    if why is not None:
        pytest.skip(why)
    module = build_variant(source, march)
    if isinstance(module, str):
        pytest.fail(f"{source.name} for -march={march}: {module}")
    return module


def use_build(build: str, owner: ModuleType, source: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Routes `owner.kernel()` to `build` of `source` for one test ("native": the installed
    one); skips the test where that build cannot be made or run here."""
    if build == "native":
        if owner.kernel() is None:
            pytest.skip(f"{source.name} is not built")
        return build
    module = build_variant(source, build)
    if isinstance(module, str):
        pytest.skip(module)
    monkeypatch.setattr(owner, "kernel", lambda: module)
    return build
