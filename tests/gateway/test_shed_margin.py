"""`gateway.shedding.Shedder`: the margin it learns from admitted turns' realised first-token
times, and how the margin moves the shedding decision and the bound the worker reserves for.
(The whole path through real clients: tests/compat/test_load_shedding.py.)"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.protocol import Finished, Timings
from gateway.engine_pool import Route
from gateway.errors import Overloaded
from gateway.shedding import MARGIN_MIN_SAMPLES, MARGIN_WINDOW, Shedder, ShedMargin


@dataclass
class _Probe:
    queue_wait_s: float


@dataclass
class _Client:
    """The engine client's probe, answering a fixed estimate and recording the bound."""

    queue_wait_s: float
    bounds: list[float] = field(default_factory=list)

    async def probe(self, namespace: str, path: list[int], *, timeout_s: float,
                    max_wait_s: float, reserve_for: str, num_new_tokens: int = 0) -> _Probe:
        self.bounds.append(max_wait_s)
        return _Probe(self.queue_wait_s)


@dataclass
class _Link:
    client: _Client
    worker_id: str = "w0"


async def _no_path() -> list[int]:
    return []


def _check(shedder: Shedder, route: Any) -> float | None:
    return asyncio.run(shedder.check(route, "ns", 16, _no_path, "turn", time.monotonic()))


def _finished(decode_s: float, output_len: int = 8) -> Finished:
    return Finished("r", "stop", [1] * output_len, "x", 100, 90, 10, output_len,
                    timings=Timings(decode_s=decode_s))


def test_margin_is_a_high_quantile_of_the_shortfalls_once_there_are_enough() -> None:
    margin = ShedMargin()
    for _ in range(MARGIN_MIN_SAMPLES - 1):
        margin.observe("w0", 1.0, 1.5)
    assert margin.margin_s("w0") == 0.0  # too few to judge
    margin.observe("w0", 1.0, 1.5)
    assert margin.margin_s("w0") == pytest.approx(0.5)
    for _ in range(MARGIN_WINDOW - MARGIN_MIN_SAMPLES):
        margin.observe("w0", 1.0, 0.5)  # early: a negative shortfall
    assert margin.margin_s("w0") == pytest.approx(0.0)  # the 95th percentile, never below 0
    assert margin.margin_s("w1") == 0.0  # per worker


def test_a_learned_margin_sheds_what_the_estimate_alone_admits() -> None:
    client = _Client(queue_wait_s=0.5)
    route: Any = Route(link=_Link(client), reason="only")  # type: ignore[arg-type]
    shedder = Shedder(2.0)
    predicted = _check(shedder, route)
    assert predicted is not None and 0.5 <= predicted < 0.6 and client.bounds == [2.0]
    for _ in range(MARGIN_MIN_SAMPLES):
        # The first token reached the gateway 1.8 s later than predicted; decoding took 0.7 s.
        began_s = time.monotonic() - (predicted + 1.8 + 0.7)
        shedder.observe(route, predicted, began_s, _finished(decode_s=0.7))
    assert shedder.margin.margin_s("w0") == pytest.approx(1.8, abs=0.05)
    with pytest.raises(Overloaded):
        _check(shedder, route)
    assert client.bounds[-1] == pytest.approx(0.2, abs=0.05)  # the worker reserves within it
    client.queue_wait_s = 0.0
    assert _check(shedder, route) is not None  # an empty queue still fits


def test_no_bound_probes_nothing_and_an_empty_output_teaches_nothing() -> None:
    client = _Client(queue_wait_s=100.0)
    route: Any = Route(link=_Link(client), reason="only")  # type: ignore[arg-type]
    assert _check(Shedder(None), route) is None and client.bounds == []
    shedder = Shedder(2.0)
    for _ in range(MARGIN_MIN_SAMPLES):
        shedder.observe(route, 0.1, time.monotonic() - 50, _finished(0.0, output_len=0))
    assert shedder.margin.margin_s("w0") == 0.0
