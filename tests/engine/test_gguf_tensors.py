"""`read_gguf_tensors` gives every tensor as `gguf.GGUFReader` does (name, type, layout and
bytes), for element and block types, with and without a custom alignment."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from engine.errors import UnsupportedModel
from engine.tokenizer_gguf import read_gguf_tensors


def _write(path: Path, alignment: int | None) -> None:
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint32("test.value", 7)
    writer.add_tensor("norm.weight", rng.standard_normal(96).astype(np.float32))
    writer.add_tensor("half.weight", rng.standard_normal((3, 64)).astype(np.float16))
    for qtype in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1,
                  GGMLQuantizationType.Q8_0):
        data = quantize(rng.standard_normal((5, 64)).astype(np.float32), qtype)
        writer.add_tensor(f"{qtype.name}.weight", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_tensors_match_gguf_reader(tmp_path: Path, alignment: int | None) -> None:
    path = tmp_path / "t.gguf"
    _write(path, alignment)
    want = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    got = read_gguf_tensors(path)
    assert set(got) == set(want) and len(got) == 5
    for name, tensor in want.items():
        mine = got[name]
        assert mine.tensor_type == tensor.tensor_type, name
        assert mine.data.shape == tensor.data.shape and mine.data.dtype == tensor.data.dtype
        assert np.array_equal(np.asarray(mine.data), np.asarray(tensor.data)), name


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(UnsupportedModel, match="not a GGUF file"):
        read_gguf_tensors(path)
