"""The issue's targets as ratios with PASS/FAIL, each beside the CPU class it was measured on.

A target compares one ratio measured in the same run (radixgate against the faster peer, batch 8
against batch 1, RSS against the file plus the KV pool, ...) with its bound
(`benchmarks.cpu_class` names the CPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.common import format_table


@dataclass(frozen=True)
class Target:
    """One target of the issue: `ratio` measured, `bound` needed (ratio >= bound, or <= with
    `at_most`). `ratio` None means it could not be measured (e.g. a peer is missing)."""

    name: str
    measured: str  # the absolute figures behind the ratio, e.g. "19.1 vs 16.0 tok/s"
    ratio: float | None
    bound: float
    at_most: bool = False
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "n/a"
        ok = self.ratio <= self.bound if self.at_most else self.ratio >= self.bound
        return "PASS" if ok else "FAIL"

    @property
    def need(self) -> str:
        return f"{'<=' if self.at_most else '>='} {self.bound:g}"

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "need": self.need, "verdict": self.verdict}


def ratio_of(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def format_targets(targets: list[Target], cpu: str) -> str:
    """The targets table: figure, ratio, bound, PASS/FAIL and the CPU class on every row."""
    rows = [[t.name, t.measured, "-" if t.ratio is None else f"{t.ratio:.3f}", t.need,
             t.verdict + (f" ({t.note})" if t.note else ""), cpu] for t in targets]
    return format_table(["target", "measured", "ratio", "need", "verdict", "CPU"], rows)


def cell(stats: dict[str, float] | None, digits: int = 1) -> str:
    """A median with its min and max: "123.4 [118.0-130.2]" ("-" when missing)."""
    if stats is None:
        return "-"
    if stats.get("n", 1) == 1:
        return f"{stats['median']:.{digits}f}"
    return (f"{stats['median']:.{digits}f} [{stats['min']:.{digits}f}-"
            f"{stats['max']:.{digits}f}]")
