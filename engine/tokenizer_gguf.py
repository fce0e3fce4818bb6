"""Reading a GGUF file's header: metadata (the key/value section) and tensor descriptions.

`gguf.GGUFReader` builds a numpy view per array element and takes ~8 s on the 98k tokenizer
strings of SmolLM2; walking the header with `struct` takes ~0.1 s. Tensor data is not read
here: `read_gguf_tensors` returns views of the memory-mapped file, laid out as `GGUFReader`
lays them out, so `gguf.quants.dequantize` takes them as they are.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

from engine.errors import UnsupportedModel

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# GGUF value type -> struct format character (GGUF spec, `gguf_type`).
_SCALAR_FORMATS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


class _Cursor:
    """A read position in a GGUF buffer; `endian` is "<" or ">" (GGUF files may be big-endian)."""

    __slots__ = ("buf", "pos", "endian")

    def __init__(self, buf: mmap.mmap, pos: int, endian: str) -> None:
        self.buf, self.pos, self.endian = buf, pos, endian

    def unpack(self, fmt: str, count: int = 1) -> tuple[Any, ...]:
        full = f"{self.endian}{count}{fmt}"
        values = struct.unpack_from(full, self.buf, self.pos)
        self.pos += struct.calcsize(full)
        return values

    def string(self) -> str:
        (size,) = self.unpack("Q")
        start, self.pos = self.pos, self.pos + size
        return self.buf[start : self.pos].decode("utf-8", errors="surrogateescape")

    def value(self, value_type: int, keep: bool) -> Any:
        """Read one value; when not `keep`, skip it as cheaply as possible and return None."""
        if value_type == _STRING:
            return self.string()
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type])[0]
        if value_type != _ARRAY:
            raise UnsupportedModel(f"unknown GGUF metadata value type {value_type}")
        item_type, count = self.unpack("I")[0], self.unpack("Q")[0]
        if item_type in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[item_type]
            if not keep:
                self.pos += count * struct.calcsize(f"{self.endian}{fmt}")
                return None
            return self.unpack(fmt, count)
        if item_type == _STRING:
            return self._strings(count, keep)
        items = [self.value(item_type, keep) for _ in range(count)]
        return tuple(items) if keep else None

    def _strings(self, count: int, keep: bool) -> tuple[str, ...] | None:
        # Inlined loop: tokenizer arrays hold ~100k strings, and per-item calls triple the time.
        buf, pos, items = self.buf, self.pos, []
        read_size = struct.Struct(f"{self.endian}Q").unpack_from
        for _ in range(count):
            (size,) = read_size(buf, pos)
            pos += 8
            if keep:
                items.append(buf[pos : pos + size].decode("utf-8", errors="surrogateescape"))
            pos += size
        self.pos = pos
        return tuple(items) if keep else None


def _walk_metadata(buf: mmap.mmap, path: Path, wanted: tuple[str, ...]) -> tuple[
        dict[str, Any], _Cursor, int]:
    """The metadata whose keys start with one of `wanted`, a cursor at the tensor descriptions
    and the number of tensors."""
    if buf[:4] != _MAGIC:
        raise UnsupportedModel(f"{path} is not a GGUF file")
    # The version is small; read little-endian it would be huge if the file is big-endian.
    endian = "<" if struct.unpack_from("<I", buf, 4)[0] < 0x10000 else ">"
    cursor = _Cursor(buf, 4, endian)
    version, num_tensors, num_kv = *cursor.unpack("I"), *cursor.unpack("Q", 2)
    if version not in (2, 3):
        raise UnsupportedModel(f"{path}: GGUF version {version} is not supported")
    meta: dict[str, Any] = {}
    for _ in range(num_kv):
        key = cursor.string()
        (value_type,) = cursor.unpack("I")
        keep = key.startswith(wanted)
        value = cursor.value(value_type, keep)
        if keep:
            meta[key] = value
    return meta, cursor, num_tensors


def read_gguf_metadata(path: Path, *, prefixes: Iterable[str] = ("",)) -> dict[str, Any]:
    """Metadata of the GGUF file at `path` whose keys start with one of `prefixes`.

    Arrays come back as tuples, strings as str. Does not read tensor data. Raises
    `UnsupportedModel` if the file is not GGUF v2/v3.
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _walk_metadata(buf, path, tuple(prefixes))[0]


# Types whose data is typed elements; every other type is raw bytes, (rows, bytes a row).
_ELEMENT_TYPES = {
    GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    # A read-only view of the file: elements in numpy order (dims reversed) for F16/F32/...,
    # else bytes, one row of blocks per row (gguf.GGUFReader's layout).
    data: np.ndarray


def read_gguf_tensors(path: Path, *, copy_on_write: bool = False) -> dict[str, GGUFTensor]:
    """The tensors of the GGUF file at `path` by name, their data memory-mapped (nothing is
    read until used): read-only, or with `copy_on_write` writable views whose writes would stay
    private (torch takes those without a warning; nothing writes to them). Raises
    `UnsupportedModel` for a file that is not GGUF v2/v3, names a tensor type this `gguf`
    package does not know, or ends before a tensor's data does (a truncated download)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        meta, cursor, num_tensors = _walk_metadata(buf, path, ("general.alignment",))
        infos = []
        for _ in range(num_tensors):
            name = cursor.string()
            (num_dims,) = cursor.unpack("I")
            dims = cursor.unpack("Q", num_dims)
            (raw_type,), (offset,) = cursor.unpack("I"), cursor.unpack("Q")
            try:
                tensor_type = GGMLQuantizationType(raw_type)
            except ValueError as exc:
                raise UnsupportedModel(
                    f"{path}: tensor {name} has unknown type {raw_type}") from exc
            infos.append((name, dims, tensor_type, offset))
        alignment = int(meta.get("general.alignment", 32))
        data_start = -(-cursor.pos // alignment) * alignment
    file = np.memmap(path, dtype=np.uint8, mode="c" if copy_on_write else "r")
    tensors = {}
    for name, dims, tensor_type, offset in infos:
        shape = tuple(reversed(dims))
        num_elements = int(np.prod(dims))
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        start = data_start + offset
        num_bytes = num_elements // block_size * type_size
        if num_elements % block_size or start + num_bytes > file.shape[0]:
            raise UnsupportedModel(
                f"{path}: tensor '{name}' ({tensor_type.name} {list(shape)}) needs bytes "
                f"{start:,}..{start + num_bytes:,} but the file has {file.shape[0]:,}: it is "
                "truncated or corrupt; download or join it again")
        raw = file[start : start + num_bytes]
        if tensor_type in _ELEMENT_TYPES:
            data = raw.view(_ELEMENT_TYPES[tensor_type]).reshape(shape)
        else:
            data = raw.reshape(quant_shape_to_byte_shape(shape, tensor_type))
        tensors[name] = GGUFTensor(name, tensor_type, data)
    return tensors
