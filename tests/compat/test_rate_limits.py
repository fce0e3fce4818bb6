"""Per-key and per-tenant limits through the real clients: a 429 with `Retry-After` and the
client family's rate-limit headers, refused before any store write; tokens settled from the
turn's usage; concurrency slots that are leases."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway import cli
from gateway.auth import KeyStore, Principal, hash_key
from gateway.rate_limits import WINDOW_MS, Limits, LimitStore, RateLimited, RateLimiter
from gateway.settings import GatewaySettings
from sessions.redis_client import open_client, open_sync_client
from tests.compat.conftest import Live

pytestmark = pytest.mark.timeout(300)


async def _key_with_limits(live: Live, tenant: str, limits: Limits, *,
                           tenant_limits: Limits | None = None) -> str:
    settings = GatewaySettings(key_prefix=live.key_prefix)
    client = open_client(live.redis_url)
    try:
        key = await KeyStore(client, settings.auth_key_prefix).create(tenant)
        store = LimitStore(client, live.key_prefix)
        await store.set(f"key:{hash_key(key)}", limits)
        if tenant_limits is not None:
            await store.set(f"tenant:{tenant}", tenant_limits)
        return key
    finally:
        await client.aclose()


def _stored_keys(live: Live) -> set[bytes]:
    """Every key under the gateway's prefix except the limits' own counters."""
    client = open_sync_client(live.redis_url)
    try:
        return {k for k in client.scan_iter(match=f"{live.key_prefix}*", count=1000)
                if b":rl:" not in k}
    finally:
        client.close()


def _window(live: Live, subject: str) -> dict[str, int]:
    client = open_sync_client(live.redis_url)
    try:
        window = int(time.time() * 1000) // WINDOW_MS
        raw = client.hgetall(f"{live.key_prefix}rl:{{{subject}}}:w:{window}")
        return {k.decode(): int(v) for k, v in raw.items()}
    finally:
        client.close()


def _chat(client: openai.OpenAI, text: str, max_tokens: int = 4, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model="tiny", max_tokens=max_tokens, temperature=0,
        messages=[{"role": "user", "content": text}], **kwargs)


def test_openai_client_gets_429_with_ratelimit_headers_before_any_store_write(
        live: Live) -> None:
    key = asyncio.run(_key_with_limits(live, "rpm-tenant", Limits(rpm=2)))
    client = live.openai(key)
    _chat(client, "one")
    _chat(client, "two")
    before = _stored_keys(live)
    with pytest.raises(openai.RateLimitError) as caught:
        _chat(client, "three, a new conversation")
    assert _stored_keys(live) == before  # no session, turn or index entry was written
    err = caught.value
    assert err.status_code == 429
    assert err.body is not None and err.body["type"] == "rate_limit_error"  # type: ignore[index]
    assert err.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    headers = err.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert _window(live, f"key:{hash_key(key)}")["req"] == 2  # the refused one is not counted


def test_anthropic_client_gets_429_with_anthropic_ratelimit_headers(live: Live) -> None:
    key = asyncio.run(_key_with_limits(live, "anthropic-tenant", Limits(),
                                       tenant_limits=Limits(rpm=1, output_tpm=1000)))
    client = live.anthropic(key)
    message: Any = {"role": "user", "content": "hello"}
    client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=[message])
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=[message])
    err = caught.value
    assert err.status_code == 429
    assert err.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    headers = err.response.headers
    assert int(headers["retry-after"]) >= 1
    assert headers["anthropic-ratelimit-requests-limit"] == "1"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["anthropic-ratelimit-output-tokens-limit"] == "1000"
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")


def test_tokens_are_settled_from_the_turns_usage(live: Live) -> None:
    key = asyncio.run(_key_with_limits(live, "token-tenant", Limits(output_tpm=100,
                                                                     input_tpm=100_000)))
    client = live.openai(key)
    done = _chat(client, "count my tokens", max_tokens=40)
    window = _window(live, f"key:{hash_key(key)}")
    usage = done.usage
    assert usage is not None
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    # The 40 reserved at admission became the real output; input counts computed tokens.
    assert window["out"] == usage.completion_tokens
    assert window["in"] == usage.prompt_tokens - (cached or 0)
    with pytest.raises(openai.RateLimitError):  # 100 - used < the next turn's reservation
        _chat(client, "again", max_tokens=100 - usage.completion_tokens + 1)


def test_concurrent_turns_limit_and_release(live: Live) -> None:
    key = asyncio.run(_key_with_limits(live, "busy-tenant", Limits(concurrent=1)))
    client = live.openai(key)
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        stream = _chat(client, "a long answer", max_tokens=48, stream=True)
        for _ in stream:
            started.set()
            release.wait(60)
        stream.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert started.wait(60)
        with pytest.raises(openai.RateLimitError) as caught:
            _chat(client, "while the other runs")
        assert caught.value.response.headers["x-ratelimit-limit-concurrent"] == "1"
    finally:
        release.set()
        holder.join(60)
    _chat(client, "after it ended")  # the slot was given back


def test_native_route_answers_429_rate_limit_error(live: Live) -> None:
    key = asyncio.run(_key_with_limits(live, "native-tenant", Limits(rpm=1)))
    with httpx.Client(base_url=live.base_url, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as http:
        sid = http.post("/v1/sessions", json={}).json()["id"]
        body = {"messages": [{"role": "user", "content": "hi"}],
                "generate": {"max_tokens": 2}}
        first = http.post(f"/v1/sessions/{sid}/turns", json=body)
        assert first.status_code == 200
        # settled from the turn's usage, though the route stops reading at its end
        assert _window(live, f"key:{hash_key(key)}")["out"] == first.json()["usage"][
            "output_tokens"]
        r = http.post(f"/v1/sessions/{sid}/turns", json=body)
        assert r.status_code == 429
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert int(r.headers["retry-after"]) >= 1
        assert len(http.get(f"/v1/sessions/{sid}").json()["turns"]) == 3  # root + 2, no more


def test_a_dead_gateways_concurrency_slot_lapses(live: Live) -> None:
    """A gateway that admitted a turn and died never settles it: the lease expires."""
    async def scenario() -> None:
        client = open_client(live.redis_url)
        try:
            await LimitStore(client, live.key_prefix).set("tenant:lapse", Limits(concurrent=1))
            dead = RateLimiter(client, live.key_prefix, lease_ttl_s=0.5)
            await dead.admit(Principal("lapse"), 10)  # never settled
            with pytest.raises(RateLimited):
                await dead.admit(Principal("lapse"), 10)
            await asyncio.sleep(0.7)
            admission = await dead.admit(Principal("lapse"), 10)
            await admission.settle(0, 0)
        finally:
            await client.aclose()
    asyncio.run(scenario())


def test_limits_must_be_positive_integers() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            Limits(rpm=bad)  # type: ignore[arg-type]


def test_responses_route_is_limited_too(live: Live) -> None:
    key = asyncio.run(_key_with_limits(live, "responses-tenant", Limits(rpm=1)))
    client = live.openai(key)
    client.responses.create(model="tiny", input="hi", max_output_tokens=4)
    with pytest.raises(openai.RateLimitError) as caught:
        client.responses.create(model="tiny", input="hi again", max_output_tokens=4)
    assert caught.value.response.headers["x-ratelimit-remaining-requests"] == "0"


def test_keys_limits_command(live: Live, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RADIXGATE_KEY_PREFIX", live.key_prefix)
    base = ["keys", "limits", "--redis-url", live.redis_url, "--state-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as bad:
        cli.main([*base, "--tenant", "cli", "--rpm", "0"])
    assert bad.value.code == 2
    assert "must be a positive integer, not '0'" in capsys.readouterr().err
    assert cli.main([*base, "--tenant", "cli", "--rpm", "30", "--concurrent", "2"]) == 0
    assert "rpm=30, concurrent=2" in capsys.readouterr().out
    client = open_sync_client(live.redis_url)
    try:
        stored = client.hgetall(f"{live.key_prefix}rl:{{tenant:cli}}:limits")
    finally:
        client.close()
    assert stored == {b"rpm": b"30", b"concurrent": b"2"}
    assert cli.main([*base, "--tenant", "cli", "--clear"]) == 0
    assert "no limits" in capsys.readouterr().out
