"""`radixgate serve` and `radixgate keys create`: the gateway's subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gateway.keys_command import add_keys_parsers
from gateway.serve import serve
from gateway.settings import GatewaySettings


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
                   help="use this Redis/Valkey instead of an embedded one (RADIXGATE_REDIS_URL); "
                   "a cluster: redis+cluster://HOST:PORT[,HOST:PORT...] (rediss+cluster:// "
                   "for TLS)")
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
    s.add_argument("--shared-prefix-file", type=Path, default=None, metavar="PATH",
                   help="a system prompt whose KV every tenant may share (its whole pages; the "
                   "rest of each prompt stays in the tenant's cache namespace; "
                   "RADIXGATE_SHARED_PREFIX gives the text itself)")
    s.add_argument("--max-queue-wait", type=_positive_seconds, default=None, metavar="SECONDS",
                   dest="max_queue_wait_s",
                   help="load shedding: a turn the engine would keep from its first token "
                   "longer than this gets 503 overloaded (Anthropic: 529) with Retry-After "
                   "instead of queueing (default: no bound; RADIXGATE_MAX_QUEUE_WAIT_S)")
    add_disagg_args(s)
    add_engine_args(s)
    s.set_defaults(func=serve_main)

    k = sub.add_parser("keys", help="manage API keys")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    add_keys_parsers(ksub)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def _settings(args: argparse.Namespace) -> GatewaySettings:
    overrides: dict[str, Any] = {
        name: value for name in ("host", "port", "state_dir", "model", "api_key", "redis_url",
                                 "shared_prefix_file", "max_queue_wait_s")
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
    if args.tp != 1:  # each worker is its own tensor-parallel group
        argv += ["--tp", str(args.tp)]
    return argv


def serve_main(args: argparse.Namespace) -> int:
    num_workers = args.workers if args.decode_workers is None else args.decode_workers
    decode_args = (["--disagg-min-tokens", str(args.disagg_min_tokens)]
                   if args.prefill_workers else [])
    return serve(_settings(args), _engine_args(args), num_workers=num_workers,
                 remote=args.engine, num_prefill=args.prefill_workers, decode_args=decode_args)
