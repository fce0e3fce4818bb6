"""Prefix-cache isolation past the device pool: the host and disk KV tiers key pages by the
namespace, so a page one tenant spilled is never loaded for another, and the workers' routing
probe only sees the asking tenant's (and salt's) prefixes. Read from usage and route reasons,
never timings. Each hit below must come from a tier: the device caches are emptied first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.engine import EngineConfig
from engine.models.loader import LoadedModel
from engine.tokenizer import Tokenizer
from gateway.cache_scope import cache_namespace
from gateway.rendering import TurnRenderer
from tests.gateway.cache_tenants import PAGE_SIZE, PROMPT, Tenants, run_tenants
from tests.gateway.test_cache_isolation import SYSTEM, ask_native


async def cold_chat(t: Tenants, tenant: str, salt: str | None = None,
                    system: str | None = None) -> int:
    """cached_tokens of a chat sent after every device cache was emptied."""
    await t.quiesce()
    t.evict_device_caches()
    return await t.chat(tenant, salt=salt, system=system)


def test_the_host_tier_never_loads_another_tenants_pages(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    async def body(t: Tenants) -> None:
        host = t.engines[0].tiers.host
        assert host is not None
        assert await t.chat("alpha") == 0
        assert await cold_chat(t, "alpha") > 0  # loaded back from the host tier
        restored = host.num_restored
        assert restored > 0
        assert await cold_chat(t, "beta") == 0
        assert await t.chat("alpha", salt="s1") == 0
        assert await cold_chat(t, "alpha", salt="s1") > 0
        restored = host.num_restored
        assert await cold_chat(t, "beta", salt="s1") == 0  # alpha's salt, beta's namespace
        assert await cold_chat(t, "alpha", salt="s2") == 0
        assert host.num_restored == restored  # nothing was loaded for them

    config = EngineConfig(kv_memory_bytes=32 << 20, host_kv_memory_bytes=16 << 20)
    run_tenants(body, redis_url=redis_url, key_prefix=redis_key_prefix, loaded=tiny_loaded,
                tokenizer=tokenizer, config=config)


def test_the_host_tier_restores_a_public_prefix_for_another_tenant(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    shared = len(TurnRenderer(tokenizer).system_token_ids(SYSTEM)) // PAGE_SIZE * PAGE_SIZE

    async def body(t: Tenants) -> None:
        host = t.engines[0].tiers.host
        assert host is not None
        assert await t.chat("alpha", system=SYSTEM) == 0
        assert await cold_chat(t, "beta", system=SYSTEM) == shared  # the public pages only
        assert host.num_restored == shared // PAGE_SIZE

    config = EngineConfig(kv_memory_bytes=32 << 20, host_kv_memory_bytes=16 << 20)
    run_tenants(body, redis_url=redis_url, key_prefix=redis_key_prefix, loaded=tiny_loaded,
                tokenizer=tokenizer, config=config, shared_prefix=SYSTEM)


def test_the_disk_tier_never_loads_another_tenants_pages(
        tmp_path: Path, redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    async def cold(t: Tenants, tenant: str, salt: str | None = None) -> int:
        await t.quiesce()  # the pins, which write the branch heads' pages, are applied
        t.evict_device_caches()
        return await ask_native(t, tenant, salt)

    async def body(t: Tenants) -> None:
        disk = t.engines[0].tiers.disk
        assert disk is not None
        assert await ask_native(t, "alpha", None) == 0
        assert await cold(t, "alpha") > 0  # read back from the files
        assert disk.num_loaded > 0
        assert await ask_native(t, "alpha", "s1") == 0
        assert await cold(t, "alpha", "s1") > 0
        loaded = disk.num_loaded
        assert await cold(t, "beta") == 0
        assert await cold(t, "beta", "s1") == 0
        assert await cold(t, "alpha", "s2") == 0
        assert disk.num_loaded == loaded

    config = EngineConfig(kv_memory_bytes=32 << 20, kv_dir=str(tmp_path), kv_disk_bytes=64 << 20)
    run_tenants(body, redis_url=redis_url, key_prefix=redis_key_prefix, loaded=tiny_loaded,
                tokenizer=tokenizer, config=config)


def test_the_routing_probe_sees_only_the_asking_tenants_prefixes(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    renderer = TurnRenderer(tokenizer)
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    path = [*renderer.system_token_ids(None),
            *renderer.input_token_ids(messages, system=None, after_root=True)]

    async def probes(t: Tenants, tenant: str, salt: str | None = None) -> list[int]:
        ns = cache_namespace(t.engines[0].stats().model, tenant, salt)
        return [(await link.client.probe(ns, path)).cached_len for link in t.pool.links]

    async def body(t: Tenants) -> None:
        counts = t.pool.route_counts
        assert await ask_native(t, "alpha", None) == 0
        assert max(await probes(t, "alpha")) > 0  # one worker holds alpha's prompt
        assert await ask_native(t, "alpha", None) > 0  # a new session, routed to it
        assert counts["prefix"] == 1
        assert await probes(t, "beta") == [0, 0]
        assert await ask_native(t, "beta", None) == 0  # no worker looked warm for beta
        assert counts["prefix"] == 1
        assert await ask_native(t, "alpha", "s1") == 0
        assert await probes(t, "beta", "s1") == [0, 0]
        assert await ask_native(t, "beta", "s1") == 0
        assert counts["prefix"] == 1 and counts["least_loaded"] == 4

    run_tenants(body, redis_url=redis_url, key_prefix=redis_key_prefix, loaded=tiny_loaded,
                tokenizer=tokenizer, num_workers=2)
