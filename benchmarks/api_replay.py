"""Replay the agent workload through a compatible route and the native session route, side by side.

    python -m benchmarks.agent_replay --api openai    [--turns N] [--json PATH]
    python -m benchmarks.agent_replay --api anthropic [--turns N] [--json PATH]

One live gateway (uvicorn in a thread, in-process engine on the real model, the real Redis at
$RADIXGATE_REDIS_URL or 127.0.0.1:6379 under a key prefix of its own, deleted afterwards). Each
route runs as its own tenant (one API key each), so the engine keeps their KV apart (namespaces
never share) and neither route rides on the other's cache.

Both routes replay the same conversation: the system prompt and task of
`benchmarks.workload.agent_trajectory`, then per turn that turn's tool result as a user message.
The assistant replies are the model's own (greedy, `--max-tokens` each); the native route appends
only the new message, the compatible route resends the whole conversation with the replies
echoed back, as a stateless agent does, and the gateway maps it onto its session tree. Per turn,
in alternating order: client TTFT (request sent → first streamed content) of each route, and the
ratio compat / native. Target: within 1.5x.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import torch
from redis.asyncio import Redis

from benchmarks.common import THREADS, finish_notes, format_table, log, machine_notes, write_json
from benchmarks.gateway_overhead import delete_prefix
from benchmarks.workload import agent_trajectory
from engine.models.loader import load_model
from gateway.auth import KeyStore
from gateway.local_server import serve_local
from gateway.settings import GatewaySettings

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
MAX_CONTEXT = 7400  # prompt tokens; the model's window is 8192
TARGET_RATIO = 1.5
_OPEN, _END = "<|im_start|>", "<|im_end|>"


def conversation_parts(num_turns: int) -> tuple[str, list[str]]:
    """(system prompt, user text per turn) of the workload: the task, then each tool result."""
    turns = agent_trajectory(num_turns)
    first = turns[0].text
    system = first.split(f"{_OPEN}system\n", 1)[1].split(_END, 1)[0]
    users = [t.text.rsplit(f"{_OPEN}user\n", 1)[1].split(_END, 1)[0] for t in turns]
    return system, users


def sse_events(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name or "", data) of each SSE frame; `data: [DONE]` ends the iteration."""
    event = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
            if data.startswith("[DONE]"):
                return
            yield event, json.loads(data)
            event = ""


class Route:
    """One route's conversation: `turn(user_text)` streams one turn and returns its numbers."""

    def __init__(self, http: httpx.Client, api: str, system: str, max_tokens: int) -> None:
        self.http, self.api, self.system, self.max_tokens = http, api, system, max_tokens
        self.messages: list[dict[str, Any]] = []
        self.session_id: str | None = None

    def turn(self, text: str) -> dict[str, Any]:
        self.messages.append({"role": "user", "content": text})
        path, body = self._request()
        started = time.perf_counter()
        ttft: float | None = None
        parts: list[str] = []
        usage: dict[str, int] = {}
        with self.http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{self.api}: {response.status_code} {response.read()!r}")
            self.session_id = response.headers.get("x-radixgate-session-id", self.session_id)
            for event, data in sse_events(response):
                piece, end = self._parse(event, data)
                if piece is not None and ttft is None:
                    ttft = time.perf_counter() - started
                parts.append(piece or "")
                usage.update(end)
        if ttft is None or "prompt" not in usage:
            raise RuntimeError(f"{self.api}: the stream had no content or no usage")
        self.messages.append({"role": "assistant", "content": "".join(parts)})
        return {"ttft_s": ttft, "total_s": time.perf_counter() - started, **usage}

    def _request(self) -> tuple[str, dict[str, Any]]:
        if self.api == "native":
            return f"/v1/sessions/{self.session_id}/turns", {
                "messages": self.messages[-1:],
                "generate": {"max_tokens": self.max_tokens, "stream": True}}
        if self.api == "openai":
            return "/v1/chat/completions", {
                "model": "gpt-4o", "max_tokens": self.max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "system", "content": self.system}, *self.messages]}
        return "/v1/messages", {
            "model": "claude-sonnet-4-6", "max_tokens": self.max_tokens, "temperature": 0,
            "stream": True, "system": self.system, "messages": self.messages}

    def _parse(self, event: str, data: dict[str, Any]) -> tuple[str | None, dict[str, int]]:
        """(content text of the frame or None, usage fields it carries)."""
        if self.api == "native":
            if event == "text_delta":
                return str(data["text"]), {}
            if event == "turn_end":
                u = data["turn"]["usage"]
                return None, {"prompt": u["input_tokens"], "cached": u["cached_tokens"],
                              "engine_ttft_ms": round(data["timings"]["ttft_s"] * 1e3, 3)}
            return None, {}
        if self.api == "openai":
            if data.get("choices"):
                content = data["choices"][0]["delta"].get("content")
                return (str(content) if content else None), {}
            u = data.get("usage") or {}
            return None, ({"prompt": u["prompt_tokens"],
                           "cached": u["prompt_tokens_details"]["cached_tokens"]} if u else {})
        if event == "content_block_delta":
            return str(data["delta"].get("text", "")), {}
        if event == "message_delta":
            u = data["usage"]
            cached = u["cache_read_input_tokens"]
            return None, {"prompt": u["input_tokens"] + cached, "cached": cached}
        return None, {}


def start(http: httpx.Client, api: str, system: str, max_tokens: int) -> Route:
    """A route with an empty conversation (the native one with its session created)."""
    route = Route(http, api, system, max_tokens)
    if api == "native":
        route.session_id = http.post("/v1/sessions", json={"system": system}).json()["id"]
    return route


async def _keys(redis_url: str, settings: GatewaySettings, tenants: list[str]) -> list[str]:
    client = Redis.from_url(redis_url)
    try:
        store = KeyStore(client, settings.auth_key_prefix)
        return [await store.create(t) for t in tenants]
    finally:
        await client.aclose()


def replay(base_url: str, keys: dict[str, str], api: str, num_turns: int,
           max_tokens: int) -> list[dict[str, Any]]:
    system, users = conversation_parts(num_turns)
    clients = {name: httpx.Client(base_url=base_url, timeout=600,
                                  headers={"Authorization": f"Bearer {key}"})
               for name, key in keys.items()}
    try:
        for name, http in clients.items():  # first-call costs stay out of the timings
            start(http, name, "warm-up", 2).turn("warm-up")
        routes = {name: start(http, name, system, max_tokens) for name, http in clients.items()}
        rows = []
        for i, text in enumerate(users):
            order = ["native", api] if i % 2 == 0 else [api, "native"]
            results = {name: routes[name].turn(text) for name in order}
            native, compat = results["native"], results[api]
            row = {"turn": i, "context_len": native["prompt"], "native": native, api: compat,
                   "ratio": compat["ttft_s"] / native["ttft_s"]}
            log(f"turn {i:2d} context {native['prompt']:5d}: native TTFT "
                f"{native['ttft_s'] * 1e3:7.1f} ms (cached {native['cached']}), {api} "
                f"{compat['ttft_s'] * 1e3:7.1f} ms (cached {compat['cached']}), "
                f"ratio {row['ratio']:.2f}")
            rows.append(row)
            if native["prompt"] > MAX_CONTEXT:
                log(f"stopping after turn {i}: context above {MAX_CONTEXT} tokens")
                break
        return rows
    finally:
        for client in clients.values():
            client.close()


def summarise(api: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    print(f"\nAgent replay through {api} vs the native session route: client TTFT per turn (ms)")
    print(format_table(
        ["turn", "context", "native cached", f"{api} cached", "native ttft", f"{api} ttft",
         f"{api}/native"],
        [[r["turn"], r["context_len"], r["native"]["cached"], r[api]["cached"],
          r["native"]["ttft_s"] * 1e3, r[api]["ttft_s"] * 1e3, r["ratio"]] for r in rows]))
    ratios = [r["ratio"] for r in rows[1:]] or [rows[0]["ratio"]]  # turn 0 has no history
    summary = {"median_ratio": statistics.median(ratios), "max_ratio": max(ratios),
               "target_ratio": TARGET_RATIO,
               "within_target": statistics.median(ratios) <= TARGET_RATIO}
    print(f"\n{api}/native TTFT, turns 1..: median {summary['median_ratio']:.2f}x, max "
          f"{summary['max_ratio']:.2f}x (target within {TARGET_RATIO}x)")
    return summary


def run_api_replay(api: str, num_turns: int, json_path: Path | None, max_tokens: int) -> None:
    """The `--api` mode of `benchmarks.agent_replay`."""
    torch.set_num_threads(THREADS)
    redis_url = os.environ.get("RADIXGATE_REDIS_URL", DEFAULT_REDIS_URL)
    prefix = f"bench:{uuid.uuid4().hex}:"
    loaded = load_model(None)
    notes = machine_notes(loaded.path)
    settings = GatewaySettings(redis_url=redis_url, key_prefix=prefix,
                               max_body_bytes=16 * 1024 * 1024)
    try:
        names = ["native", api]
        keys = dict(zip(names, asyncio.run(_keys(redis_url, settings, [
            f"bench-{n}" for n in names])), strict=True))
        with serve_local(loaded, settings, model_name="smollm2-135m",
                         kv_memory_bytes=1 << 30) as base_url:
            rows = replay(base_url, keys, api, num_turns, max_tokens)
    finally:
        log(f"deleted {delete_prefix(redis_url, prefix)} benchmark keys")
    finish_notes(notes)
    result = {"notes": notes, "api": api, "max_tokens": max_tokens, "turns": rows,
              "summary": summarise(api, rows)}
    write_json(json_path or Path(f"bench-results/api_replay_{api}.json"), result)
