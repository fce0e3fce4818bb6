"""GGUF files radixgate cannot run fail at load with what is wrong named: an architecture outside
the registry, a tensor type it does not load, a tensor missing or misshapen. The files are real
GGUFs: a converted tiny checkpoint rewritten with one thing changed (gguf-py's reader and
writer, as its gguf_new_metadata script copies a file)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from engine.errors import UnsupportedModel
from engine.models.loader import load_model
from tests.gguf_convert import convert
from tests.tiny_hf import build_tiny

# (name, numpy shape, ggml type, raw data) of a tensor in the rewritten file; None drops it.
TensorEdit = Callable[[str, np.ndarray, T], tuple[str, np.ndarray, T] | None]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_tiny("qwen2", tmp_path_factory.mktemp("qwen2"))
    return convert(folder, folder / "qwen2.gguf")


def rewrite(src: Path, dst: Path, *, arch: str | None = None,
            edit: TensorEdit | None = None) -> Path:
    reader = gguf.GGUFReader(src)
    old_arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch or old_arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        name = field.name.replace(f"{old_arch}.", f"{arch}.") if arch else field.name
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        entry = (tensor.name, np.array(tensor.data), tensor.tensor_type)
        edited = edit(*entry) if edit else entry
        if edited is None:
            continue
        name, data, kind = edited
        if kind in (T.F32, T.F16):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def _load(path: Path) -> None:
    load_model(str(path), "fp32", show_progress=False)


def test_the_unedited_copy_loads(source: Path, tmp_path: Path) -> None:
    _load(rewrite(source, tmp_path / "copy.gguf"))


def test_unsupported_architecture_lists_the_supported_ones(source: Path, tmp_path: Path) -> None:
    path = rewrite(source, tmp_path / "phi3.gguf", arch="phi3")
    with pytest.raises(UnsupportedModel, match=r"'phi3'.*gemma3.*qwen3moe"):
        _load(path)


def test_unsupported_tensor_type_is_named(source: Path, tmp_path: Path) -> None:
    block_bytes = gguf.GGML_QUANT_SIZES[T.Q2_K][1]

    def to_q2_k(name: str, data: np.ndarray, kind: T) -> tuple[str, np.ndarray, T]:
        if name != "blk.1.ffn_up.weight":
            return name, data, kind
        # One 256-value block a row: the loader must refuse the type before reading it.
        return name, np.zeros((data.shape[0], block_bytes), np.uint8), T.Q2_K

    path = rewrite(source, tmp_path / "q2k.gguf", edit=to_q2_k)
    with pytest.raises(UnsupportedModel, match=r"'blk\.1\.ffn_up\.weight'.*Q2_K"):
        _load(path)


def test_missing_tensor_is_named(source: Path, tmp_path: Path) -> None:
    def drop(name: str, data: np.ndarray, kind: T) -> tuple[str, np.ndarray, T] | None:
        return None if name == "blk.2.attn_k.bias" else (name, data, kind)

    with pytest.raises(UnsupportedModel, match=r"lacks .*'layers\.2\.k_bias'"):
        _load(rewrite(source, tmp_path / "missing.gguf", edit=drop))


def test_misshapen_tensor_names_both_shapes(source: Path, tmp_path: Path) -> None:
    def shrink(name: str, data: np.ndarray, kind: T) -> tuple[str, np.ndarray, T]:
        return (name, data[:48].copy(), kind) if name == "blk.0.attn_q.weight" else (
            name, data, kind)

    with pytest.raises(UnsupportedModel,
                       match=r"'blk\.0\.attn_q\.weight'.*\[48, 64\].*\[64, 64\]"):
        _load(rewrite(source, tmp_path / "shape.gguf", edit=shrink))


@pytest.mark.parametrize("qtype", ["f32", "q4_k_m"])
@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_file_names_the_tensor_cut_off(qtype: str, keep: float,
                                                  tmp_path: Path) -> None:
    """A download cut short: the header reads, a tensor's bytes run past the end. Refused at
    load, naming that tensor, with nothing built (the dense path, and the codes path that
    would otherwise map the missing bytes)."""
    folder = build_tiny("qwen2", tmp_path / "qwen2",
                        overrides={"hidden_size": 256, "intermediate_size": 512})
    whole = convert(folder, tmp_path / f"{qtype}.gguf", qtype=qtype).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: int(len(whole) * keep)])
    for packed in (True, False):
        with pytest.raises(UnsupportedModel, match=r"tensor '[^']+'.*truncated or corrupt"):
            load_model(str(cut), "fp32", show_progress=False, packed=packed)
