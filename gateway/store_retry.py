"""Riding out a short store outage (an embedded Valkey restarting from its AOF) for writes that
must not be lost, such as a finished turn's reply after all its compute."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.errors import is_store_outage

T = TypeVar("T")
OUTAGE_WAIT_S = 30.0  # longer than a restart with a large AOF takes here


async def through_store_outage(call: Callable[[], Awaitable[T]], *,
                               wait_s: float = OUTAGE_WAIT_S) -> T:
    """`await call()`, called again while the store is down (a connection error, LOADING) for
    up to `wait_s`. `call` must be safe to repeat (an idempotent write). Other errors, and the
    outage once `wait_s` is spent, propagate."""
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            return await call()
        except Exception as exc:
            if not is_store_outage(exc) or time.monotonic() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
