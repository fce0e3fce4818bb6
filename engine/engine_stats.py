"""The engine's counters as a `Stats` message."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.protocol import Stats

if TYPE_CHECKING:
    from engine.engine import Engine


def engine_stats(engine: Engine, request_id: str = "") -> Stats:
    s = engine.scheduler
    return Stats(request_id, len(s.running), len(s.waiting), engine.page_pool.num_pages,
                 engine.page_pool.num_free_pages, engine.cache.num_cached_pages,
                 s.prefix_query_tokens, s.prefix_hit_tokens, engine.num_finished,
                 engine.loaded.name, engine.kv_pool.layout.page_size,
                 num_drafted=engine.speculator.num_drafted if engine.speculator else 0,
                 num_accepted=engine.speculator.num_accepted if engine.speculator else 0,
                 vocab_hash=engine.loaded.tokenizer.vocab_hash,
                 num_locked_pages=engine.cache.num_locked_pages, num_pins=engine.cache.num_pins,
                 worker_id=engine.worker_id,
                 num_host_restored_pages=engine.tiers.host.num_restored if engine.tiers.host
                 else 0, context_len=engine.context_len)
