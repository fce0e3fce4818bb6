"""`radixgate keys create` and `radixgate keys limits`: API keys and their limits, written into
the store of the server that uses them (or, when none runs on the state dir, straight into its
embedded store's data)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from gateway.auth import KeyStore, hash_key
from gateway.errors import InvalidRequest
from gateway.rate_limits import LIMIT_NAMES, Limits, LimitStore
from gateway.serve import StoreNotFound, embedded_data_dir, find_store_url
from gateway.settings import GatewaySettings
from sessions.embedded import EmbeddedServerError, EmbeddedValkey
from sessions.redis_client import StoreClient, open_client

_FLAGS = {"rpm": "requests per minute", "input_tpm": "input tokens per minute (computed, "
          "not read from the cache)", "output_tpm": "output tokens per minute",
          "concurrent": "turns running at once"}


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a clear message otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value


def add_keys_parsers(ksub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = ksub.add_parser("create", help="create a key for a tenant; prints it once")
    c.add_argument("--tenant", required=True)
    _store_flags(c)
    _limit_flags(c, "of the new key")
    c.set_defaults(func=keys_create_main)
    lim = ksub.add_parser("limits", help="show or set the limits of a tenant or of one key")
    who = lim.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", help="limits shared by all the tenant's keys")
    who.add_argument("--key", help="limits of this key alone (its tenant's apply too)")
    _store_flags(lim)
    _limit_flags(lim, "to set")
    lim.add_argument("--clear", action="store_true", help="remove every limit of the subject")
    lim.set_defaults(func=keys_limits_main)


def keys_create_main(args: argparse.Namespace) -> int:
    settings = _settings(args)
    try:
        key, where = asyncio.run(_create_key(settings, args.tenant, _limits(args)))
    except (InvalidRequest, StoreNotFound, EmbeddedServerError) as exc:
        print(f"radixgate keys: error: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(f"radixgate keys: created a key for tenant {args.tenant!r} in {where}; it is not "
          "shown again", file=sys.stderr)
    return 0


def keys_limits_main(args: argparse.Namespace) -> int:
    subject = f"tenant:{args.tenant}" if args.tenant else f"key:{hash_key(args.key)}"
    limits = _limits(args)
    change = bool(args.clear or limits.as_mapping())
    try:
        shown, where = asyncio.run(_limits_of(_settings(args), subject,
                                              Limits() if args.clear else limits, change))
    except (StoreNotFound, EmbeddedServerError) as exc:
        print(f"radixgate keys: error: {exc}", file=sys.stderr)
        return 2
    name = f"tenant {args.tenant!r}" if args.tenant else "this key"
    values = ", ".join(f"{k}={v}" for k, v in shown.as_mapping().items()) or "no limits"
    print(f"{name}: {values} ({'set in' if change else 'read from'} {where})")
    return 0


def _store_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="the state dir of the server whose store is used (default "
                        "~/.radixgate, as for `serve`)")
    parser.add_argument("--redis-url", default=None,
                        help="use this Redis/Valkey instead (a server started with it)")


def _limit_flags(parser: argparse.ArgumentParser, which: str) -> None:
    for name, what in _FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=positive_int, default=None,
                            metavar="N", help=f"{what} {which}")


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(**{name: getattr(args, name) for name in LIMIT_NAMES})


def _settings(args: argparse.Namespace) -> GatewaySettings:
    overrides = {name: value for name in ("state_dir", "redis_url")
                 if (value := getattr(args, name, None)) is not None}
    return GatewaySettings(**overrides)


async def _create_key(settings: GatewaySettings, tenant: str,
                      limits: Limits) -> tuple[str, str]:
    """(the new key, a description of the store it went to)."""
    async with _store(settings) as (redis, where):
        key = await KeyStore(redis, settings.auth_key_prefix).create(tenant)
        if limits.as_mapping():
            await LimitStore(redis, settings.key_prefix).set(f"key:{hash_key(key)}", limits)
        return key, where


async def _limits_of(settings: GatewaySettings, subject: str, limits: Limits,
                     change: bool) -> tuple[Limits, str]:
    async with _store(settings) as (redis, where):
        store = LimitStore(redis, settings.key_prefix)
        if change:
            await store.set(subject, limits)
        return await store.get(subject), where


@contextlib.asynccontextmanager
async def _store(settings: GatewaySettings) -> AsyncIterator[tuple[StoreClient, str]]:
    """The store of the server running on the state dir (or `redis_url`), else the embedded
    store's data opened by a Valkey of our own for the duration."""
    url = await find_store_url(settings)
    valkey: EmbeddedValkey | None = None
    if url is not None:
        where = f"the store of the running server ({url})"
    else:  # no server runs on this state dir: write into its embedded store's AOF directly
        valkey = EmbeddedValkey(embedded_data_dir(settings), appendfsync="always").start()
        url = valkey.url
        where = f"the embedded store under {valkey.data_dir} (no server is running)"
    redis = open_client(url)
    try:
        yield redis, where
    finally:
        await redis.aclose()
        if valkey is not None:
            valkey.stop()
