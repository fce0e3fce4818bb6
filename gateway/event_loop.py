"""The gateway's event loop: uvloop when it is installed (the `server` extra), else asyncio's.

uvloop's libuv loop cuts the per-request cost of the loop itself (scheduling, sockets) roughly in
half on this path; behaviour is the same, so asyncio's loop remains the fallback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the gateway's loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
