"""PNG plot of the agent replay: TTFT against context length, per engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import log


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = [("ttft_cached_s", "radixgate (prefix cache)"),
              ("ttft_uncached_s", "radixgate (no cache, recompute)")]
    series += [(f"{p}_ttft_s", f"{p} (own prefix cache)") for p in result.get("peers", [])]
    for ax, key, title in ((ax1, "turns", "Agent replay: each turn"),
                           (ax2, "sweep", "Fixed 256-token delta")):
        rows = result[key]
        for column, label in series:
            ax.plot([r["context_len"] for r in rows], [r[column] for r in rows],
                    marker="o", markersize=3, label=label)
        ax.set(xlabel="context length (tokens)", ylabel="TTFT (s)", title=title, yscale="log")
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(f"hit rate {result['hit_rate']:.1%}, uncached/cached at deepest turn "
                 f"{result['ratio_deepest']:.1f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")
