"""Which peer engines are installed: lazy imports, a note for each missing one, never a failure."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from benchmarks.peers.base import Peer

INSTALL_HINT = "pip install '.[bench]'"


class PeerSpec(NamedTuple):
    """How to find and build one peer: `module:factory` plus the engine package it needs."""

    name: str
    module: str
    factory: str
    requires: str


PEER_SPECS: tuple[PeerSpec, ...] = (
    PeerSpec("llama.cpp", "benchmarks.peers.llama_cpp_peer", "LlamaCppPeer", "llama_cpp"),
    PeerSpec("openvino-genai", "benchmarks.peers.openvino_peer", "OpenVINOPeer", "openvino_genai"),
)


def _note(message: str, skipped: list[str] | None) -> None:
    print(message, file=sys.stderr, flush=True)
    if skipped is not None:
        skipped.append(message)


def load_factory(spec: PeerSpec, skipped: list[str] | None = None) -> Callable[..., Peer] | None:
    """The peer's constructor, or None (with a one-line note on stderr, and in `skipped`) if its
    engine is missing."""
    try:
        importlib.import_module(spec.requires)
        module = importlib.import_module(spec.module)
    except ImportError as exc:
        _note(f"{spec.name} not installed ({INSTALL_HINT}): {exc}", skipped)
        return None
    factory: Callable[..., Peer] = getattr(module, spec.factory)
    return factory


def available_peers(
    gguf_path: str | Path,
    threads: int = 2,
    *,
    include_prompt_lookup: bool = False,
    names: set[str] | None = None,
    context_len: int | None = None,
    skipped: list[str] | None = None,
) -> list[Peer]:
    """Loads every installed peer on `gguf_path` with `threads` threads, in `PEER_SPECS` order.

    Missing peers are skipped with a note on stderr. A peer that is installed but fails to load is
    also skipped with a note (a broken peer must not stop a benchmark). `include_prompt_lookup`
    adds OpenVINO GenAI's prompt-lookup pipeline ("openvino-genai+pld"), a second model load.
    `names` restricts loading to those peer names. `context_len` sizes llama.cpp's context
    (default: SmolLM2's 8192; OpenVINO's paged cache grows as needed). Returns an empty list if
    no peer is available. Each skipped peer's note is appended to `skipped` too.
    """
    peers: list[Peer] = []
    for spec in PEER_SPECS:
        if names is not None and spec.name not in names:
            continue
        factory = load_factory(spec, skipped)
        if factory is None:
            continue
        variants: list[dict[str, bool | int]] = [{}]
        if include_prompt_lookup and spec.name == "openvino-genai":
            variants.append({"prompt_lookup": True})
        if context_len is not None and spec.name == "llama.cpp":
            variants = [{"n_ctx": context_len}]
        for kwargs in variants:
            try:
                peers.append(factory(gguf_path, threads, **kwargs))
            except Exception as exc:  # any engine error means "skip this peer"
                _note(f"{spec.name} failed to load {gguf_path}: {type(exc).__name__}: "
                      f"{' '.join(str(exc).split())}", skipped)
    return peers
