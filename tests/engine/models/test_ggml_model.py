"""A model served from its GGUF's codes (engine.models.ggml_weight), on tiny converted
checkpoints of every kernel type: the loader keeps every quantised projection, the embedding
and the lm_head as views of the file (no dense copy) holding gguf's values bit for bit; the fp32
path equals the dense reference up to summation order, the int8 path stays near it; and on the
int8 path a row's logits have the same bits whatever chunks its prompt was prefilled in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.attention.base import PagedBatch
from engine.attention.cpu_extend import extend_choice
from engine.attention.cpu_paged import CpuPagedAttention
from engine.attention.dense import DenseAttention
from engine.kv_pool import KVLayout, KVPool
from engine.models import ggml_weight
from engine.models.decoder import DecoderModel
from engine.models.ggml_weight import GgmlWeight
from engine.models.loader import LoadedModel, load_model
from engine.models.weights import projections
from engine.tokenizer_gguf import read_gguf_tensors
from tests.gguf_convert import convert
from tests.tiny_hf import build_tiny

pytestmark = pytest.mark.skipif(not ggml_weight.kernels_built(), reason="kernels not built")

WIDE = {"hidden_size": 256, "intermediate_size": 512}  # K-quant rows (256) fit
# id: (family, overrides, qtype): between them every kernel type (Q4_0, Q4_1, Q5_0, Q5_1,
# Q8_0, Q4_K, Q5_K, Q6_K), fused parts of different types, llama's permuted Q/K rows, biases.
CASES = {
    "llama_q4_1": ("llama", {}, "q4_1"),
    "qwen2_q4_0": ("qwen2", {}, "q4_0"),
    "llama_q8_0": ("llama", {}, "q8_0"),
    "qwen2_q4_k_m": ("qwen2", WIDE, "q4_k_m"),
    "llama_q5_k": ("llama", WIDE, "q5_k"),
    "llama_q6_k": ("llama", WIDE, "q6_k"),
}


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    built: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in built:
            family, overrides, qtype = CASES[case]
            folder = build_tiny(family, tmp_path_factory.mktemp(case), overrides=overrides)
            built[case] = convert(folder, folder / f"{case}.gguf", qtype=qtype)
        return built[case]

    return get


def _mapped(path: Path) -> list[tuple[int, int]]:
    """Address ranges this process maps `path` at (/proc/self/maps)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path.resolve())):
            lo, hi = line.split()[0].split("-")
            ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def _within(data: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    at = data.data_ptr()
    return any(lo <= at and at + data.numel() <= hi for lo, hi in ranges)


def _codes(model: DecoderModel) -> list[GgmlWeight]:
    w = model.weights
    every = [*(p for layer in w.layers for p in projections(layer)), w.embed, w.lm_head]
    return [p for p in every if isinstance(p, GgmlWeight)]


@pytest.mark.parametrize("case", list(CASES))
def test_codes_are_the_files_and_nothing_is_dequantised(case: str,
                                                        gguf: Callable[[str], Path]) -> None:
    path = gguf(case)
    loaded = load_model(str(path), "fp32", show_progress=False)
    dense = load_model(str(path), "fp32", show_progress=False, packed=False).model
    model = loaded.model
    # Every quantised tensor of the file is read from its codes.
    quantised = {t.tensor_type for t in read_gguf_tensors(path).values()
                 if t.tensor_type.name.startswith("Q")}
    assert {p.qtype for w in _codes(model) for p in w.parts} == quantised
    assert all(isinstance(p, GgmlWeight) for layer in model.weights.layers
               for p in projections(layer) if quantised)
    mapped = _mapped(path)
    assert mapped, f"{path} is not memory-mapped"
    llama_qk = (model.config.q_size, model.config.kv_size)
    for layer in model.weights.layers:
        assert isinstance(layer.qkv, GgmlWeight)
        for i, part in enumerate(layer.qkv.parts):
            # llama's Q/K rows are permuted by its converter: a copy of their codes in order
            copied = model.config.architecture == "llama" and i < 2
            assert _within(part.data, mapped) != copied, part.n
            assert part.n == llama_qk[min(i, 1)]
    for weight in _codes(model):
        for part in weight.parts:
            assert _within(part.data, mapped) or part.n in llama_qk
    # The same values as the dense reference, bit for bit.
    pairs = [(model.weights.embed, dense.weights.embed),
             (model.weights.lm_head, dense.weights.lm_head)]
    for mine, ref in zip(model.weights.layers, dense.weights.layers, strict=True):
        pairs += list(zip(projections(mine), projections(ref), strict=True))
    for mine_w, ref_w in pairs:
        assert isinstance(ref_w, torch.Tensor)
        got = mine_w.dense() if isinstance(mine_w, GgmlWeight) else mine_w
        assert torch.equal(got, ref_w)
    ids = torch.tensor([3, 1, 4, 1, 5])
    assert isinstance(dense.weights.embed, torch.Tensor)
    assert torch.equal(ggml_weight.embedding(ids, model.weights.embed), dense.weights.embed[ids])


def _logits(model: DecoderModel, num_rows: int) -> torch.Tensor:
    ids = torch.randint(0, model.config.vocab_size, (num_rows,),
                        generator=torch.Generator().manual_seed(num_rows))
    hidden = model.forward(ids, torch.arange(num_rows), DenseAttention([num_rows]))
    return model.logits(hidden)


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_path_equals_the_dense_reference(case: str, gguf: Callable[[str], Path]) -> None:
    path = gguf(case)
    codes = load_model(str(path), "fp32", show_progress=False).model
    dense = load_model(str(path), "fp32", show_progress=False, packed=False).model
    assert "fp32 path" in codes.weights_name and dense.weights_name == "dense"
    for num_rows in (1, 5, 9, 40):  # the decode kernels' and the panel GEMM's row counts
        # Summation order only; a wrong code, scale or row moves logits by O(1).
        torch.testing.assert_close(_logits(codes, num_rows), _logits(dense, num_rows),
                                   rtol=1e-4, atol=5e-4)


@pytest.mark.parametrize("case", list(CASES))
def test_int8_path_stays_near_the_dense_reference(case: str,
                                                  gguf: Callable[[str], Path]) -> None:
    path = gguf(case)
    int8 = load_model(str(path), "int8", show_progress=False).model
    dense = load_model(str(path), "fp32", show_progress=False, packed=False).model
    assert "int8 path" in int8.weights_name
    for num_rows in (1, 5, 40):
        want, got = _logits(dense, num_rows), _logits(int8, num_rows)
        # Each projection is off by the activations' rounding (~0.5% of its norm); the random
        # tiny model amplifies that, where a wrong code, scale or layout is ~100%.
        relative = ((got - want).norm() / want.norm()).item()
        assert relative < 0.15, relative


def _paged_logits(loaded: LoadedModel, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """The last row's logits after prefilling `ids` in chunks of those lengths, each chunk a
    forward over the paged pool (the served attention) reading the earlier chunks' KV."""
    model = loaded.model
    page_size = 4
    num_pages = -(-len(ids) // page_size)
    pool = KVPool(model.config, KVLayout(num_pages, page_size, 0), model.kv_dtype)
    table = torch.arange(num_pages)
    start = 0
    hidden = torch.empty(0)
    for size in chunks:
        rows = torch.arange(start, start + size)
        batch = PagedBatch([size], [start + size], rows, [table])
        hidden = model.forward(torch.tensor(ids[start:start + size]), rows,
                               CpuPagedAttention(pool, batch))
        start += size
    assert start == len(ids)
    return model.logits(hidden[-1:])


@pytest.mark.parametrize("case", ["llama_q4_1", "qwen2_q4_k_m", "llama_q6_k"])
def test_int8_logits_do_not_depend_on_the_chunking(case: str,
                                                   gguf: Callable[[str], Path]) -> None:
    loaded = load_model(str(gguf(case)), "int8", show_progress=False)
    config = loaded.model.config
    path, why = extend_choice(loaded.model.kv_dtype, config.head_dim)
    if path != "c":
        pytest.skip(f"extends here take the {path} path ({why}): only --deterministic makes "
                    "them chunking-invariant on this build")
    ids = torch.randint(0, loaded.model.config.vocab_size, (53,),
                        generator=torch.Generator().manual_seed(7)).tolist()
    want = _paged_logits(loaded, ids, [53])
    for chunks in ([1] * 53, [17, 17, 19], [40, 13], [8, 1, 44]):
        got = _paged_logits(loaded, ids, chunks)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), chunks
