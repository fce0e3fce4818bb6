"""The many-row int8 GEMM on GGUF blocks (engine.models.ggml_gemm, csrc/ggml_gemm.c): its bits
equal `ggml_ref.reference_int8` (activations quantised per block of 32 for every type) for every
type, row count, n (a multiple of the kernel's 32-output panels or not) and k, with accumulate
and a row stride; a row's bits do not depend on the rows beside it; bad types and shapes are
refused. Every SIMD path runs here: the installed build, and builds this file compiles
(kernel_builds.build_variant) for -march=native, Cascade Lake (the first AVX512-VNNI CPU: it
holds the AVX512 path to F, BW, VL and VNNI, whatever -march=native adds here), AVX-VNNI on 256
bits where this CPU has it, AVX2 (x86-64-v3, as on Zen 3) and the scalar path (x86-64-v2). A
build that does not compile fails its tests; one this CPU cannot run is skipped."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.models import ggml_gemm, ggml_ref
from engine.models.model_parts import PARTED_MODELS, model_cache
from tests.engine.attention.kernel_builds import build_variant
from tests.engine.models.test_kquant import F16_FIELDS, random_blocks

ROOT = Path(__file__).resolve().parents[3]
CSRC = ROOT / "engine/models/csrc"
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
K_TYPES = {T.Q4_K, T.Q5_K, T.Q6_K}
_AVX2 = ("avx2", "fma", "f16c")
# Each compiled build: -march, extra flags, the /proc/cpuinfo flags it needs, its simd().
VARIANTS = {"native": ("native", (), (), None),
            "cascadelake": ("cascadelake", (), (*_AVX2, "avx512f", "avx512bw", "avx512vl",
                                                 "avx512dq", "avx512cd", "avx512_vnni"),
                            "avx512_vnni"),
            "avx_vnni": ("x86-64-v3", ("-mavxvnni",), (*_AVX2, "avx_vnni"), "avx_vnni"),
            "avx2": ("x86-64-v3", (), _AVX2, "avx2"),
            "scalar": ("x86-64-v2", (), ("sse4_2",), "scalar")}
BUILDS = ["installed", *VARIANTS]

pytestmark = pytest.mark.skipif(ggml_gemm.kernel() is None,
                                reason="engine.models._ggml_gemm is not built")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split()}


@functools.cache
def _variant(name: str) -> ModuleType:
    """`name` compiled from the sources here. build_variant keys its cache by the .c and the
    shared headers, not ours (ggml_gemm_*.h, beside the .c): their digest goes in as a macro,
    so an edited header rebuilds. A compiler error fails the test."""
    march, extra, _, _ = VARIANTS[name]
    digest = hashlib.sha256()
    for header in sorted(CSRC.glob("ggml_gemm_*.h")):
        digest.update(header.read_bytes())
    module = build_variant(CSRC / "ggml_gemm.c", march,
                           (*extra, f"-DGGML_GEMM_HEADERS_SHA={digest.hexdigest()[:16]}"))
    if isinstance(module, str):
        pytest.fail(f"the {name} build of ggml_gemm.c: {module}")
    return module


@pytest.fixture(params=BUILDS)
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Routes ggml_gemm.kernel() to one build for the test."""
    name: str = request.param
    if name == "installed":
        module = ggml_gemm.kernel()
        assert module is not None
    else:
        if platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip("the compiled builds are x86-64 builds")
        if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
            pytest.skip("no C compiler")
        missing = set(VARIANTS[name][2]) - _cpu_flags()
        if missing:
            pytest.skip(f"this CPU lacks {' '.join(sorted(missing))}")
        module = _variant(name)
        expected = VARIANTS[name][3]
        assert expected is None or module.simd() == expected
    monkeypatch.setattr(ggml_gemm, "kernel", lambda: module)
    return name


def weights(qtype: T, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random valid blocks (n, row bytes), f16 scales over a wide range, subnormals included."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(F16_FIELDS, T.Q5_1, (0, 2))  # test_kquant's helper: d at 0, m at 2
        return random_blocks(qtype, (n, k), seed)


def activations(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Gaussian rows of varied scales, with a zero block (scale 0) and an outlier (which takes
    its block of 32)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp(torch.randn(rows, 1, generator=g) * 2)
    x[rows // 2, :32] = 0.0
    x[0, min(5, k - 1)] = 1e3
    return x


def run(qtype: T, raw: np.ndarray, x: torch.Tensor, y: torch.Tensor | None = None, *,
        ldy: int | None = None, accumulate: bool = False,
        num_threads: int = 2) -> torch.Tensor:
    n = raw.shape[0]
    rows, k = x.shape
    act = ggml_ref.quantize_rows(x)
    out = torch.zeros(rows, n) if y is None else y
    w = torch.from_numpy(np.ascontiguousarray(raw))
    return ggml_gemm.gemm(qtype.value, w, n, k, act.xq, act.dx, act.xs, act.sums, rows, out,
                          ldy if ldy is not None else out.stride(0), accumulate, num_threads)


def assert_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == torch.float32
    same = got.contiguous().view(torch.int32) == want.contiguous().view(torch.int32)
    assert bool(same.all()), (f"{int((~same).sum())} of {same.numel()} values differ, the first "
                              f"at {tuple(int(i) for i in (~same).nonzero()[0])}")


# (rows, n, k): every row count, n a multiple of 32, of 16 but not 32, of neither (40), and k of
# one block up to 8960 (a k of 32-weight types that is no multiple of 256 comes in too).
CASES = [(1, 40, 1536), (3, 16, 256), (16, 256, 512), (17, 48, 1536), (64, 40, 8960),
         (130, 256, 256)]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_bits_equal_the_reference(build: str, qtype: T, case: tuple[int, int, int]) -> None:
    rows, n, k = case
    if qtype not in K_TYPES and k == 512:
        k = 544  # 17 blocks of 32: no multiple of 64, 128 or 256
    raw = weights(qtype, n, k, seed=rows + n)
    x = activations(rows, k, seed=rows)
    got = run(qtype, raw, x, num_threads=1 + rows % 2)
    assert_bits(got, ggml_ref.reference_int8(x, qtype, raw))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_row_does_not_depend_on_the_rows_beside_it(build: str, qtype: T) -> None:
    k = 768 if qtype in K_TYPES else 736
    raw = weights(qtype, 48, k, seed=3)
    x = activations(130, k, seed=4)
    full = run(qtype, raw, x)
    for r in (0, 5, 77, 129):
        assert_bits(run(qtype, raw, x[r:r + 1].clone(), num_threads=1), full[r:r + 1])
    assert_bits(run(qtype, raw, x[60:77].clone()), full[60:77])


@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "num_threads"), [(20, 2), (64, 3), (65, 2), (100, 1)])
def test_many_panels_and_threads(build: str, qtype: T, rows: int, num_threads: int) -> None:
    """Nine panels, the last one partial, among threads that claim them one ahead: up to 64 rows
    a panel, the next panel's weights are prefetched while one computes; more, not."""
    n, k = 32 * 8 + 5, 512 if qtype in K_TYPES else 544
    raw = weights(qtype, n, k, seed=rows)
    x = activations(rows, k, seed=rows + 1)
    assert_bits(run(qtype, raw, x, num_threads=num_threads),
                ggml_ref.reference_int8(x, qtype, raw))


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_accumulate_and_row_stride(build: str, qtype: T) -> None:
    rows, n, k = 19, 40, 512
    raw = weights(qtype, n, k, seed=9)
    x = activations(rows, k, seed=9)
    want = ggml_ref.reference_int8(x, qtype, raw)
    # ldy > n: the padding columns are never written
    y = torch.full((rows, n + 9), 7.5)
    run(qtype, raw, x, y, ldy=n + 9)
    assert_bits(y[:, :n], want)
    assert bool((y[:, n:] == 7.5).all())
    # accumulate: one fp32 addition after the whole sum
    residual = torch.randn(rows, n + 9)
    start = residual.clone()
    assert run(qtype, raw, x, residual, ldy=n + 9, accumulate=True) is residual
    assert_bits(residual[:, :n], start[:, :n] + want)
    assert torch.equal(residual[:, n:], start[:, n:])


def test_types_fill_the_columns_of_one_output(build: str) -> None:
    """q, k and v of different types write their columns of one fused output (column slices)."""
    rows, k = 21, 768
    parts = [(T.Q4_K, 64), (T.Q6_K, 40), (T.Q8_0, 32)]
    x = activations(rows, k, seed=2)
    fused = torch.full((rows, sum(n for _, n in parts)), float("nan"))
    at = 0
    for i, (qtype, n) in enumerate(parts):
        raw = weights(qtype, n, k, seed=i)
        run(qtype, raw, x, fused[:, at:at + n], ldy=fused.stride(0))
        assert_bits(fused[:, at:at + n], ggml_ref.reference_int8(x, qtype, raw))
        at += n


@functools.cache
def _real_tensors(model: str) -> dict[str, tuple[T, np.ndarray]] | None:
    """A model's tensors by name (type, read-only memory map), if its joined GGUF is already in
    the model cache (never joined here). Cached: the reader parses the whole vocabulary."""
    from gguf import GGUFReader

    parted = PARTED_MODELS[model]
    path = model_cache() / parted.file_name
    if not (path.is_file() and path.stat().st_size == parted.num_bytes):
        return None
    return {t.name: (T(t.tensor_type), t.data) for t in GGUFReader(str(path)).tensors}


@pytest.mark.slow
@pytest.mark.parametrize(("model", "tensor", "num_rows"), [
    ("qwen2.5-coder-1.5b", "blk.0.attn_k.weight", 70),      # Q4_K 256 x 1536
    ("qwen2.5-coder-1.5b", "blk.0.attn_v.weight", 33),      # Q6_K
    ("qwen2.5-coder-1.5b", "blk.0.ffn_down.weight", 20),    # Q6_K 1536 x 8960 (192 rows of it)
    ("qwen2.5-coder-0.5b", "blk.0.attn_q.weight", 37),      # Q5_0 896 x 896
    ("qwen2.5-coder-0.5b", "blk.0.attn_v.weight", 18),      # Q8_0 128 x 896
])
def test_real_tensors_from_the_memory_map(build: str, model: str, tensor: str,
                                          num_rows: int) -> None:
    tensors = _real_tensors(model)
    if tensors is None:
        pytest.skip(f"{model} is not in the model cache")
    qtype, data = tensors[tensor]
    data = data[:192]  # the read-only memory map itself: its first 192 rows
    assert not data.flags.writeable
    fmt = ggml_ref.FORMATS[qtype]
    n, k = data.shape[0], data.shape[1] // fmt.block_bytes * fmt.block_weights
    x = activations(num_rows, k, seed=num_rows) * 0.1
    act = ggml_ref.quantize_rows(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: the array is not writable
        w = torch.from_numpy(data)
        want = ggml_ref.reference_int8(x, qtype, data)
    y = ggml_gemm.gemm(qtype.value, w, n, k, act.xq, act.dx, act.xs, act.sums, num_rows,
                       torch.empty(num_rows, n), n)
    assert_bits(y, want)


def test_bad_types_and_shapes_are_refused() -> None:
    raw = torch.from_numpy(weights(T.Q4_K, 16, 256))
    x = activations(3, 256)
    act = ggml_ref.quantize_rows(x)
    xq, dx, xs, sums = act.xq, act.dx, act.xs, act.sums
    y = torch.zeros(3, 16)

    def call(**changes: object) -> None:
        args: dict[str, object] = {"type_id": T.Q4_K.value, "w": raw, "n": 16, "k": 256,
                                   "xq": xq, "dx": dx, "xs": xs, "sums": sums, "rows": 3,
                                   "y": y, "ldy": 16}
        args.update(changes)
        ggml_gemm.gemm(**args)  # type: ignore[arg-type]

    call()
    with pytest.raises(ValueError, match="no int8 kernel for type 1"):
        call(type_id=T.F16.value)
    with pytest.raises(ValueError, match="no int8 kernel for type 10"):
        call(type_id=T.Q2_K.value)
    with pytest.raises(ValueError, match="not a positive multiple of 256"):
        call(k=200)
    with pytest.raises(ValueError, match="weight w must have shape"):
        call(n=15)
    with pytest.raises(ValueError, match="weight w must have shape"):
        call(type_id=T.Q6_K.value)  # 144-byte rows are not Q6_K's 210
    with pytest.raises(TypeError, match="activations xq must be torch.int8"):
        call(xq=xq.view(torch.uint8))
    with pytest.raises(ValueError, match="activation scales dx must have shape"):
        call(dx=torch.zeros(3, 1))  # per 256: the old contract's K-quant blocks
    with pytest.raises(ValueError, match="block sums xs must have shape"):
        call(xs=torch.zeros(3, 16))
    with pytest.raises(TypeError, match="block sums xs must be torch.float32"):
        call(xs=torch.zeros(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="activation sums must be contiguous"):
        call(sums=torch.zeros(16, 3, dtype=torch.int16).T)
    with pytest.raises(ValueError, match="ldy = 8 is below n = 16"):
        call(ldy=8)
    with pytest.raises(ValueError, match="y must be"):
        call(y=torch.zeros(2, 16))
    with pytest.raises(ValueError, match="strides"):
        call(y=torch.zeros(16, 3).T)
    with pytest.raises(TypeError, match="y must be torch.float32"):
        call(y=torch.zeros(3, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="negative"):
        call(rows=-1)
    # no rows: nothing to do
    ggml_gemm.gemm(T.Q4_K.value, raw, 16, 256, xq[:0], dx[:0], xs[:0], sums[:0], 0, y[:0], 16)
    assert ggml_gemm.row_bytes(T.Q6_K.value, 512) == 420
