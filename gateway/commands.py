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
from gateway.serve import StoreNotFound, embedded_data_dir, find_store_url, serve
from gateway.settings import GatewaySettings
from sessions.embedded import EmbeddedServerError, EmbeddedValkey


def add_subcommands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from engine.cli import add_disagg_args, add_engine_args

    s = sub.add_parser("serve", help="serve the session API (gateway + engine worker)")
    s.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=None, help="HTTP port (default 8080)")
    s.add_argument("--state-dir", type=Path, default=None,
                   help="embedded Valkey data and pid files (default ~/.radixgate)")
    s.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback host with no API key created")
    s.add_argument("--api-key", default=None,
                   help="enforce API keys; this one is the local tenant's (RADIXGATE_API_KEY)")
    s.add_argument("--redis-url", default=None,
                   help="use this Redis/Valkey instead of an embedded one (RADIXGATE_REDIS_URL)")
    s.add_argument("--workers", type=int, default=1, metavar="N",
                   help="engine worker processes to start (default 1); a turn goes to the "
                   "worker holding its parent's KV")
    s.add_argument("--engine", action="append", default=[], metavar="tcp://HOST:PORT",
                   help="also route to this worker started with `radixgate engine` "
                   "(repeatable; with --workers 0, only to these)")
    s.add_argument("--prefill-workers", type=int, default=0, metavar="P",
                   help="disaggregated prefill/decode: P workers only prefill long deltas and "
                   "send their KV (torch.distributed, gloo) to the decode workers (default 0)")
    s.add_argument("--decode-workers", type=int, default=None, metavar="D",
                   help="with --prefill-workers: the workers turns are routed to (default: "
                   "--workers)")
    add_disagg_args(s)
    add_engine_args(s)
    s.set_defaults(func=serve_main)

    k = sub.add_parser("keys", help="manage API keys")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    c = ksub.add_parser("create", help="create a key for a tenant; prints it once")
    c.add_argument("--tenant", required=True)
    c.add_argument("--state-dir", type=Path, default=None,
                   help="the state dir of the server whose store gets the key (default "
                   "~/.radixgate, as for `serve`)")
    c.add_argument("--redis-url", default=None,
                   help="write into this Redis/Valkey instead (a server started with it)")
    c.set_defaults(func=keys_create_main)


def _settings(args: argparse.Namespace) -> GatewaySettings:
    overrides: dict[str, Any] = {
        name: value for name in ("host", "port", "state_dir", "model", "api_key", "redis_url")
        if (value := getattr(args, name, None)) is not None}
    if getattr(args, "insecure", False):
        overrides["insecure"] = True
    return GatewaySettings(**overrides)


def _engine_args(args: argparse.Namespace) -> list[str]:
    argv = ["--dtype", args.dtype, "--kv-memory", str(args.kv_memory),
            "--host-kv-memory", str(args.host_kv_memory), "--kv-disk", str(args.kv_disk),
            "--page-size", str(args.page_size), "--max-running", str(args.max_running),
            "--max-batch-tokens", str(args.max_batch_tokens),
            "--attention-backend", args.attention_backend, "--spec", args.spec,
            "--max-draft-len", str(args.max_draft_len), "--draft-backoff",
            str(args.draft_backoff), "--draft-topk", str(args.draft_topk),
            "--draft-steps", str(args.draft_steps), "--device", args.device]
    if args.model:
        argv += ["--model", args.model]
    if args.max_context:
        argv += ["--max-context", str(args.max_context)]
    if args.no_swa_memory:
        argv.append("--no-swa-memory")
    argv += ["--swa-kv-ratio", str(args.swa_kv_ratio)]
    if args.kv_disk:  # the workers of one state dir share it (files are named by content)
        argv += ["--kv-dir", str(args.kv_dir or _settings(args).state_dir / "kv")]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    if args.no_prefix_cache:
        argv.append("--no-prefix-cache")
    if args.no_cuda_graphs:
        argv.append("--no-cuda-graphs")
    if args.no_packed_weights:
        argv.append("--no-packed-weights")
    if args.deterministic:
        argv.append("--deterministic")
    return argv


def serve_main(args: argparse.Namespace) -> int:
    num_workers = args.workers if args.decode_workers is None else args.decode_workers
    decode_args = (["--disagg-min-tokens", str(args.disagg_min_tokens)]
                   if args.prefill_workers else [])
    return serve(_settings(args), _engine_args(args), num_workers=num_workers,
                 remote=args.engine, num_prefill=args.prefill_workers, decode_args=decode_args)


def keys_create_main(args: argparse.Namespace) -> int:
    settings = _settings(args)
    try:
        key, where = asyncio.run(_create_key(settings, args.tenant))
    except (InvalidRequest, StoreNotFound, EmbeddedServerError) as exc:
        print(f"radixgate keys: error: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(f"radixgate keys: created a key for tenant {args.tenant!r} in {where}; it is not "
          "shown again", file=sys.stderr)
    return 0


async def _create_key(settings: GatewaySettings, tenant: str) -> tuple[str, str]:
    """(the new key, a description of the store it went to)."""
    url = await find_store_url(settings)
    valkey: EmbeddedValkey | None = None
    if url is not None:
        where = f"the store of the running server ({url})"
    else:  # no server runs on this state dir: write into its embedded store's AOF directly
        valkey = EmbeddedValkey(embedded_data_dir(settings), appendfsync="always").start()
        url = valkey.url
        where = f"the embedded store under {valkey.data_dir} (no server is running)"
    redis = Redis.from_url(url)
    try:
        return await KeyStore(redis, settings.auth_key_prefix).create(tenant), where
    finally:
        await redis.aclose()
        if valkey is not None:
            valkey.stop()
