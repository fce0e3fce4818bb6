"""Per-tenant and per-key limits, kept in Redis: requests/min, input tokens/min, output
tokens/min and concurrent turns.

A turn is admitted against each *subject* it belongs to: its API key (when the key has limits)
and its tenant. Each subject's keys share one hash tag, so each script touches one cluster slot
(`{prefix}` defaults to `rg:`):

    rg:rl:{tenant:<name>}:limits     HASH  rpm, input_tpm, output_tpm, concurrent (set by
    rg:rl:{key:<sha256>}:limits            `radixgate keys limits`; absent: no limit)
    rg:rl:{<subject>}:w:<minute>     HASH  req, in, out counted in that fixed 60-s window
    rg:rl:{<subject>}:leases         ZSET  lease id -> expiry ms, one per running turn

Admission (one script per subject, before any engine work or store write) counts the request,
reserves the turn's `max_tokens` against output tokens/min, and takes a concurrency lease.
Input tokens are checked at arrival (the window must still have room) and counted when the turn
ends, because a turn's prompt is only known once it is rendered against the stored session: so,
as in Envoy AI Gateway, one turn may overshoot the input limit. Input tokens count what the
engine computed, not prompt tokens read from the cache (Anthropic's rule). Settling replaces
the output reservation by the real output and gives the lease back. Leases expire after
`LEASE_TTL_S` unless renewed, so a gateway that dies leaks no concurrency slot.

A subject found without limits is remembered for `NO_LIMITS_TTL_S`, so a gateway whose tenants
have none adds no store round trip to most turns; limits set later apply within that time.

When Redis does not answer, admission raises its outage error: the turn gets 503
`store_unavailable` (fail closed; the turn could not be stored anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

from gateway.auth import Principal
from gateway.errors import ApiError, Dialect
from gateway.rate_limit_headers import Usage, rate_limit_headers
from sessions.redis_client import StoreClient

LIMIT_NAMES = ("rpm", "input_tpm", "output_tpm", "concurrent")
WINDOW_MS = 60_000
LEASE_TTL_S = 30.0  # renewed every third of it while the turn runs
NO_LIMITS_TTL_S = 10.0  # how long a subject seen without limits is not asked again
MAX_REMEMBERED = 4096

_ADMIT = """
local raw = redis.call('HGETALL', KEYS[1])
if #raw == 0 then return {0} end
local lim = {}
for i = 1, #raw, 2 do lim[raw[i]] = tonumber(raw[i + 1]) end
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local w = redis.call('HMGET', KEYS[2], 'req', 'in', 'out')
local req, inp, out = tonumber(w[1]) or 0, tonumber(w[2]) or 0, tonumber(w[3]) or 0
local busy = redis.call('ZCARD', KEYS[3])
local reserve = tonumber(ARGV[3])
if lim.output_tpm then reserve = math.min(reserve, lim.output_tpm) end
local over = ''
if lim.rpm and req + 1 > lim.rpm then over = 'requests'
elseif lim.input_tpm and inp >= lim.input_tpm then over = 'input_tokens'
elseif lim.output_tpm and out + reserve > lim.output_tpm then over = 'output_tokens'
elseif lim.concurrent and busy >= lim.concurrent then over = 'concurrent' end
local snap = {lim.rpm or -1, req, lim.input_tpm or -1, inp, lim.output_tpm or -1, out,
              lim.concurrent or -1, busy}
if over ~= '' then return {1, over, snap} end
redis.call('HINCRBY', KEYS[2], 'req', 1)
redis.call('HINCRBY', KEYS[2], 'out', reserve)
redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[6]))
if lim.concurrent then
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[4])
  redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[5]))
end
return {2, reserve, snap}
"""

# KEYS: window, leases. ARGV: input tokens, output change, requests change, lease id.
_SETTLE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'in', tonumber(ARGV[1]))
  redis.call('HINCRBY', KEYS[1], 'out', tonumber(ARGV[2]))
  redis.call('HINCRBY', KEYS[1], 'req', tonumber(ARGV[3]))
end
redis.call('ZREM', KEYS[2], ARGV[4])
return 1
"""


@dataclass(frozen=True)
class Limits:
    """One subject's limits; None: unlimited. Every set value is a positive integer."""

    rpm: int | None = None
    input_tpm: int | None = None
    output_tpm: int | None = None
    concurrent: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ValueError(f"{f.name} must be a positive integer, not {value!r}")

    def as_mapping(self) -> dict[str, int]:
        return {name: value for name in LIMIT_NAMES if (value := getattr(self, name)) is not None}


class RateLimited(ApiError):
    """A subject is over one of its limits: 429 with `Retry-After` and the client family's
    rate-limit headers."""

    error_type = "rate_limit_error"

    def __init__(self, which: str, usage: Usage, retry_after_s: float) -> None:
        names = {"requests": "requests per minute", "input_tokens": "input tokens per minute",
                 "output_tokens": "output tokens per minute", "concurrent": "concurrent turns"}
        limit = usage.limit[_LIMIT_OF[which]]
        super().__init__(f"rate limit reached: {names[which]} (limit {limit}); retry after "
                         f"{max(1, round(retry_after_s))} s")
        self.which = which
        self.usage = usage
        self.retry_after_s = retry_after_s

    def wire_headers(self, dialect: Dialect) -> dict[str, str]:
        return rate_limit_headers(dialect, self.usage, self.retry_after_s)


_LIMIT_OF = {"requests": "rpm", "input_tokens": "input_tpm", "output_tokens": "output_tpm",
             "concurrent": "concurrent"}


class LimitStore:
    """Read and write subjects' limits (the `radixgate keys limits` command)."""

    def __init__(self, redis: StoreClient, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix

    def key(self, subject: str) -> str:
        return f"{self.prefix}rl:{{{subject}}}:limits"

    async def set(self, subject: str, limits: Limits) -> None:
        """Replace `subject`'s limits (all None: remove them). Two single-key commands: a turn
        admitted between them sees the new values set and the old ones not yet removed."""
        key = self.key(subject)
        values: dict[Any, Any] = limits.as_mapping()
        if values:
            await self.redis.hset(key, mapping=values)
        unset = [name for name in LIMIT_NAMES if name not in values]
        if unset:
            await self.redis.hdel(key, *unset)

    async def get(self, subject: str) -> Limits:
        raw = await self.redis.hgetall(self.key(subject))
        return Limits(**{(k.decode() if isinstance(k, bytes) else k): int(v)
                         for k, v in raw.items()})


@dataclass
class Admission:
    """One admitted turn's reservations, one per limited subject. Settled exactly once."""

    limiter: RateLimiter
    lease_id: str
    held: list[tuple[str, str, int]]  # (subject, window key, output reserved)
    settled: bool = False

    async def settle(self, input_tokens: int = 0, output_tokens: int = 0, *,
                     refund: bool = False) -> None:
        """Count the turn's real usage (or, with `refund`, undo the request) and give the
        leases back. Never raises: a lease that is not given back lapses after its TTL."""
        if self.settled:
            return
        self.settled = True
        for subject, window, reserved in self.held:
            with contextlib.suppress(Exception):
                await self.limiter.settle_one(subject, window, self.lease_id,
                                              0 if refund else input_tokens,
                                              (0 if refund else output_tokens) - reserved,
                                              -1 if refund else 0)

    async def watch(self, events: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
        """`events` of a turn, renewing the leases while they run and settling with the turn's
        usage (a TurnEnded's engine result) as soon as it is seen: a caller may stop reading at
        the TurnEnded without closing the events; a turn that ends without one settles at
        close with no usage."""
        renew = asyncio.get_running_loop().create_task(self._renew())
        try:
            async for event in events:
                finished = getattr(event, "finished", None)
                if finished is not None:
                    await self.settle(finished.computed_len, finished.output_len)
                yield event
        finally:
            renew.cancel()
            await events.aclose()
            await self.settle()

    async def _renew(self) -> None:
        while not self.settled:
            await asyncio.sleep(self.limiter.lease_ttl_s / 3)
            for subject, _, _ in self.held:
                with contextlib.suppress(Exception):  # a missed renewal frees a slot early
                    await self.limiter.renew(subject, self.lease_id)


class RateLimiter:
    """Admits turns against the limits stored under `prefix`."""

    def __init__(self, redis: StoreClient, prefix: str, *,
                 lease_ttl_s: float = LEASE_TTL_S) -> None:
        self.redis = redis
        self.prefix = prefix
        self.lease_ttl_s = lease_ttl_s
        self._admit = redis.register_script(_ADMIT)
        self._settle = redis.register_script(_SETTLE)
        self._unlimited: OrderedDict[str, float] = OrderedDict()  # subject -> until (monotonic)

    async def admit(self, principal: Principal, max_output_tokens: int) -> Admission:
        """Admit one turn or raise RateLimited (nothing held then). Raises the store's outage
        errors (a 503 for the client)."""
        now_ms = int(time.time() * 1000)
        window = now_ms // WINDOW_MS
        admission = Admission(self, uuid.uuid4().hex, [])
        for subject in principal.subjects():
            if self._unlimited.get(subject, 0.0) > time.monotonic():
                continue
            window_key = self._key(subject, f"w:{window}")
            try:
                answer = await self._admit(
                    keys=[self._key(subject, "limits"), window_key, self._key(subject, "leases")],
                    args=[now_ms, (window + 1) * WINDOW_MS, max_output_tokens,
                          admission.lease_id, int(self.lease_ttl_s * 1000), WINDOW_MS])
            except BaseException:
                await admission.settle(refund=True)
                raise
            if answer[0] == 1:
                await admission.settle(refund=True)
                usage = _usage(answer[2], (window + 1) * WINDOW_MS - now_ms)
                raise RateLimited(_text(answer[1]), usage,
                                  1.0 if _text(answer[1]) == "concurrent" else usage.reset_s)
            if answer[0] == 2:
                admission.held.append((subject, window_key, int(answer[1])))
            else:
                self._remember_unlimited(subject)
        return admission

    def _remember_unlimited(self, subject: str) -> None:
        self._unlimited[subject] = time.monotonic() + NO_LIMITS_TTL_S
        self._unlimited.move_to_end(subject)
        if len(self._unlimited) > MAX_REMEMBERED:
            self._unlimited.popitem(last=False)

    async def settle_one(self, subject: str, window_key: str, lease_id: str,
                         input_tokens: int, output_change: int, request_change: int) -> None:
        await self._settle(keys=[window_key, self._key(subject, "leases")],
                           args=[input_tokens, output_change, request_change, lease_id])

    async def renew(self, subject: str, lease_id: str) -> None:
        expiry_ms = int((time.time() + self.lease_ttl_s) * 1000)
        await self.redis.zadd(self._key(subject, "leases"), {lease_id: expiry_ms}, xx=True)

    def _key(self, subject: str, suffix: str) -> str:
        return f"{self.prefix}rl:{{{subject}}}:{suffix}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _usage(snap: Sequence[Any], reset_ms: int) -> Usage:
    values = [int(v) for v in snap]
    return Usage(limit=dict(zip(LIMIT_NAMES, values[0::2], strict=True)),
                 used=dict(zip(LIMIT_NAMES, values[1::2], strict=True)), reset_s=reset_ms / 1000)


@contextlib.asynccontextmanager
async def refunded_on_error(admission: Admission | None) -> AsyncIterator[None]:
    """Undo an admission when the block raises before its turn's events are watched (the
    turn never ran: a conflict, an overloaded engine, a bad request)."""
    try:
        yield
    except BaseException:
        if admission is not None:
            await admission.settle(refund=True)
        raise
