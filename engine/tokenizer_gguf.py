"""Reading GGUF metadata (the key/value header) without touching tensor data.

`gguf.GGUFReader` builds a numpy view per array element and takes ~8 s on the 98k tokenizer
strings of SmolLM2; walking the header with `struct` takes ~0.1 s.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def read_gguf_metadata(path: Path, *, prefixes: Iterable[str] = ("",)) -> dict[str, Any]:
    """Metadata of the GGUF file at `path` whose keys start with one of `prefixes`.

    Arrays come back as tuples, strings as str. Does not read tensor data. Raises
    `UnsupportedModel` if the file is not GGUF v2/v3.
    """
    wanted = tuple(prefixes)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != _MAGIC:
            raise UnsupportedModel(f"{path} is not a GGUF file")
        # The version is small; read little-endian it would be huge if the file is big-endian.
        endian = "<" if struct.unpack_from("<I", buf, 4)[0] < 0x10000 else ">"
        cursor = _Cursor(buf, 4, endian)
        version, _num_tensors, num_kv = *cursor.unpack("I"), *cursor.unpack("Q", 2)
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
        return meta
