"""Prefix-cache isolation between tenants (`gateway.cache_scope`), read from usage only, never
timings: on every route a tenant's repeat hits its own cache, another tenant's identical
prompt reports 0 cached tokens, and so does another tenant sending the first one's
`cache_salt`; a different salt within the tenant also starts cold. An operator's declared public
prefix is shared, and only up to its whole pages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from engine.models.loader import LoadedModel
from engine.tokenizer import Tokenizer
from gateway.cache_scope import cache_namespace
from gateway.cli import build_parser
from gateway.commands import _settings
from gateway.rendering import TurnRenderer
from tests.gateway.cache_tenants import PAGE_SIZE, PROMPT, Tenants, run_tenants

Ask = Callable[[Tenants, str, str | None], Awaitable[int]]


async def ask_chat(t: Tenants, tenant: str, salt: str | None) -> int:
    return await t.chat(tenant, salt=salt)


async def ask_messages(t: Tenants, tenant: str, salt: str | None) -> int:
    extra = {"cache_salt": salt} if salt is not None else None
    reply = await t.anthropic(tenant).messages.create(
        model="claude-tiny", max_tokens=2, extra_body=extra,
        messages=[{"role": "user", "content": PROMPT}])
    return reply.usage.cache_read_input_tokens or 0


async def ask_responses(t: Tenants, tenant: str, salt: str | None) -> int:
    extra = {"cache_salt": salt} if salt is not None else None
    reply = await t.openai(tenant).responses.create(
        model="tiny", input=PROMPT, max_output_tokens=2, temperature=0, store=False,
        extra_body=extra)
    assert reply.usage is not None
    return reply.usage.input_tokens_details.cached_tokens


async def ask_native(t: Tenants, tenant: str, salt: str | None) -> int:
    headers = t.auth(tenant)
    r = await t.http.post("/v1/sessions", json={}, headers=headers)
    assert r.status_code == 201, r.text
    body: dict[str, Any] = {"messages": [{"role": "user", "content": PROMPT}],
                            "generate": {"max_tokens": 2}}
    if salt is not None:
        body["cache_salt"] = salt
    r = await t.http.post(f"/v1/sessions/{r.json()['id']}/turns", json=body, headers=headers)
    assert r.status_code == 200, r.text
    cached: int = r.json()["usage"]["cached_tokens"]
    return cached


ROUTES: dict[str, Ask] = {"chat": ask_chat, "messages": ask_messages,
                          "responses": ask_responses, "native": ask_native}


def test_the_namespace_is_a_length_prefixed_hash_of_model_tenant_and_salt() -> None:
    ns = cache_namespace("m", "org_1", "2345")
    assert ns != cache_namespace("m", "org_12345", "")  # the framing, not the concatenation
    assert ns != cache_namespace("m", "org_1", None) == cache_namespace("m", "org_1", "")
    assert cache_namespace("m2", "org_1") != cache_namespace("m", "org_1")
    # a salt cannot name another tenant's namespace, whatever it contains
    assert cache_namespace("m", "beta", cache_namespace("m", "alpha")) != cache_namespace(
        "m", "alpha")
    assert len(ns) == 32 and int(ns, 16) >= 0


@pytest.mark.parametrize("route", list(ROUTES))
def test_tenants_and_salts_never_share_cached_prefixes(
        route: str, redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    ask = ROUTES[route]

    async def body(t: Tenants) -> None:
        assert await ask(t, "alpha", None) == 0
        assert await ask(t, "alpha", None) > 0  # the same tenant's repeat
        assert await ask(t, "beta", None) == 0  # another tenant, the identical prompt
        assert await ask(t, "alpha", "s1") == 0  # a salt splits the tenant's namespace
        assert await ask(t, "alpha", "s1") > 0
        assert await ask(t, "beta", "s1") == 0  # another tenant sending alpha's salt
        assert await ask(t, "alpha", "s2") == 0  # the same tenant, another salt
        assert await ask(t, "beta", None) > 0  # beta's own repeat still hits

    run_tenants(body, redis_url=redis_url, key_prefix=redis_key_prefix, loaded=tiny_loaded,
                tokenizer=tokenizer)


BAD_SALTS = ["", "x" * 129, "a\x00b", 7]
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages",
         "responses": "/v1/responses"}


def test_an_invalid_cache_salt_is_refused_on_every_route(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    bodies: dict[str, dict[str, Any]] = {
        "chat": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        "messages": {"model": "tiny", "max_tokens": 2,
                     "messages": [{"role": "user", "content": "hi"}]},
        "responses": {"model": "tiny", "input": "hi"},
        "native": {"messages": [{"role": "user", "content": "hi"}]},
    }

    async def body(t: Tenants) -> None:
        headers = t.auth("alpha")
        r = await t.http.post("/v1/sessions", json={}, headers=headers)
        paths = {**PATHS, "native": f"/v1/sessions/{r.json()['id']}/turns"}
        for route, path in paths.items():
            for salt in BAD_SALTS:
                r = await t.http.post(path, json={**bodies[route], "cache_salt": salt},
                                      headers=headers)
                # the native API answers every malformed field with 422 validation_error
                status, kind = (422, "validation_error") if route == "native" else (
                    400, "invalid_request_error")
                assert r.status_code == status, (route, salt, r.text)
                assert r.json()["error"]["type"] == kind, (route, r.text)
                assert "cache_salt" in r.text, (route, r.text)  # the body names the field
        # 128 characters, anything but NUL, is a salt
        assert await t.chat("alpha", salt="é" * 128) == 0

    run_tenants(body, redis_url=redis_url, key_prefix=redis_key_prefix, loaded=tiny_loaded,
                tokenizer=tokenizer)


SYSTEM = "You are the build assistant of ACME. Follow the rules. " * 6


def test_a_declared_public_prefix_is_shared_and_nothing_after_it(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    public = TurnRenderer(tokenizer).system_token_ids(SYSTEM)
    shared = len(public) // PAGE_SIZE * PAGE_SIZE
    assert shared >= 2 * PAGE_SIZE

    async def body(t: Tenants) -> None:
        assert await t.chat("alpha", system=SYSTEM) == 0
        mine = await t.chat("alpha", system=SYSTEM)
        assert mine > shared  # alpha's own repeat: the prefix and its own turn
        # beta, alpha's exact prompt: the declared prefix's whole pages, nothing of alpha's
        assert await t.chat("beta", system=SYSTEM) == shared
        assert await t.chat("beta", "another question", system=SYSTEM, salt="b1") == shared
        # a prompt that does not start with the prefix shares nothing
        assert await t.chat("beta", system="Other rules. " + SYSTEM, salt="b2") == 0

    run_tenants(body, redis_url=redis_url, key_prefix=redis_key_prefix, loaded=tiny_loaded,
                tokenizer=tokenizer, shared_prefix=SYSTEM)


def test_without_the_option_an_identical_system_prompt_is_not_shared(
        redis_url: str, redis_key_prefix: str, tiny_loaded: LoadedModel,
        tokenizer: Tokenizer) -> None:
    async def body(t: Tenants) -> None:
        assert await t.chat("alpha", system=SYSTEM) == 0
        assert await t.chat("alpha", system=SYSTEM) > 0
        assert await t.chat("beta", system=SYSTEM) == 0

    run_tenants(body, redis_url=redis_url, key_prefix=redis_key_prefix, loaded=tiny_loaded,
                tokenizer=tokenizer)


def test_serve_takes_the_shared_prefix_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "system.txt"
    path.write_text(SYSTEM, encoding="utf-8")
    args = build_parser().parse_args(["serve", "--shared-prefix-file", str(path)])
    assert _settings(args).shared_prefix_text() == SYSTEM
    with pytest.raises(ValidationError, match="shared_prefix_file"):  # stops at start
        _settings(build_parser().parse_args(["serve", "--shared-prefix-file",
                                             str(tmp_path / "missing.txt")]))
