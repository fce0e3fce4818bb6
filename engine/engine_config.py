"""What an engine is built with: frozen, set once from the CLI or a caller."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.kv_pool import DEFAULT_SWA_RATIO
from engine.models.base import Model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    page_size: int = 16
    kv_memory_bytes: int = 1 << 30
    max_running: int = 32
    max_batch_tokens: int = 1024  # tokens per step: decodes plus prefill chunks
    enable_prefix_cache: bool = True
    attention_backend: str = "auto"  # engine.attention.registry.backend_for
    spec: str = "suffix"  # speculative drafting: "suffix" (trajectory), "draft:<gguf path>", "none"
    max_draft_len: int = 8
    draft_backoff: int = 16  # skip drafting up to this many steps after misses (0: never skip)
    # EAGLE-3 tree drafts: children per node and frontier width (1: a chain), and the tree's
    # depth (0: max_draft_len); max_draft_len bounds the nodes verified.
    draft_topk: int = 1
    draft_steps: int = 0
    check_invariants: bool = False  # run every structure's check_invariants() after each step
    device: str = "cpu"  # "cuda"/"cuda:N": weights (in their loaded dtype), KV pool and forward
    cuda_graphs: bool = True  # replay decode steps as CUDA graphs (engine.cuda_graph); CUDA only
    host_kv_memory_bytes: int = 0  # a host KV tier that evicted pages spill into (0: none)
    kv_dir: str | None = None  # pinned heads' KV is written here (engine.cache.disk_tier)
    kv_disk_bytes: int = 0  # bound on kv_dir (0: no disk tier)
    # Longest sequence (prompt + output) served; None: the model's own context length.
    max_context: int | None = None
    # A model with sliding-window layers keeps their KV only for the window (own page group,
    # given back as the window moves, tombstoned in the prefix cache); False keeps full-length
    # KV for them (the reference). Not with the host or disk tier, which move whole pages.
    swa_memory: bool = True
    swa_ratio: float = DEFAULT_SWA_RATIO  # sliding-layer pages per full-layer page
    # Every forward on the decode path (engine.deterministic): a token's logits do not depend
    # on the cache, the chunking, the batch or drafting. Slower prefill.
    deterministic: bool = False
    # Tensor parallelism: ranks that each hold 1/tp of the heads, KV heads, MLP units and
    # experts (engine.tp); rank 0 is this process and runs the scheduler and sampling.
    tp: int = 1


def swa_memory_applies(config: EngineConfig, model: Model) -> bool:
    """Whether `model`'s sliding-window layers get their own, window-sized page group."""
    windowed = any(s.window is not None for s in model.attention_specs)
    if not (windowed and config.swa_memory):
        return False
    if config.host_kv_memory_bytes or config.kv_disk_bytes:
        logger.info("sliding-window layers keep full-length KV: the host and disk tiers move "
                    "whole pages of every layer")
        return False
    return True
