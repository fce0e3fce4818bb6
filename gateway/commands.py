"""`radixgate serve` and `radixgate keys create`: the gateway's subcommands."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from gateway.auth import KeyStore
from gateway.errors import InvalidRequest
from gateway.serve import read_pids, serve
from gateway.settings import GatewaySettings
from sessions.embedded import EmbeddedValkey


def add_subcommands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from engine.cli import add_engine_args

    s = sub.add_parser("serve", help="serve the session API (gateway + engine worker)")
    s.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=None, help="HTTP port (default 8080)")
    s.add_argument("--state-dir", type=Path, default=None,
                   help="embedded Valkey data and pid files (default ~/.radixgate)")
    s.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback host with no API key created")
    add_engine_args(s)
    s.set_defaults(func=serve_main)

    k = sub.add_parser("keys", help="manage API keys")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    c = ksub.add_parser("create", help="create a key for a tenant; prints it once")
    c.add_argument("--tenant", required=True)
    c.add_argument("--state-dir", type=Path, default=None)
    c.set_defaults(func=keys_create_main)


def _settings(args: argparse.Namespace) -> GatewaySettings:
    overrides: dict[str, Any] = {
        name: value for name in ("host", "port", "state_dir", "model")
        if (value := getattr(args, name, None)) is not None}
    if getattr(args, "insecure", False):
        overrides["insecure"] = True
    return GatewaySettings(**overrides)


def _engine_args(args: argparse.Namespace) -> list[str]:
    argv = ["--dtype", args.dtype, "--kv-memory", str(args.kv_memory),
            "--page-size", str(args.page_size), "--max-running", str(args.max_running),
            "--max-batch-tokens", str(args.max_batch_tokens),
            "--attention-backend", args.attention_backend, "--spec", args.spec,
            "--max-draft-len", str(args.max_draft_len), "--device", args.device]
    if args.model:
        argv += ["--model", args.model]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    if args.no_prefix_cache:
        argv.append("--no-prefix-cache")
    if args.no_cuda_graphs:
        argv.append("--no-cuda-graphs")
    return argv


def serve_main(args: argparse.Namespace) -> int:
    return serve(_settings(args), _engine_args(args))


def keys_create_main(args: argparse.Namespace) -> int:
    settings = _settings(args)
    try:
        key = asyncio.run(_create_key(settings, args.tenant))
    except InvalidRequest as exc:
        print(f"radixgate keys: error: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(f"radixgate keys: created a key for tenant {args.tenant!r}; it is not shown again",
          file=sys.stderr)
    return 0


async def _create_key(settings: GatewaySettings, tenant: str) -> str:
    url = settings.redis_url or read_pids(settings).get("valkey_url")
    valkey: EmbeddedValkey | None = None
    redis: Redis | None = None
    try:
        if url is not None:
            redis = Redis.from_url(str(url))
            try:
                await redis.ping()
            except Exception:  # noqa: BLE001 - a stale URL of a stopped serve
                await redis.aclose()
                redis = None
        if redis is None:
            valkey = EmbeddedValkey(settings.state_dir / "valkey").start()
            redis = Redis.from_url(valkey.url)
        return await KeyStore(redis, settings.auth_key_prefix).create(tenant)
    finally:
        if redis is not None:
            await redis.aclose()
        if valkey is not None:
            valkey.stop()
