"""PNG plot of the agent replay: TTFT against context length, per engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import log


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("sweep", f"Fixed {result['sweep'][0]['delta_len']}-token delta")]
    if result["turns"]:
        panels.insert(0, ("turns", "Agent replay: each turn"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    series = [("ttft_cached_s", "radixgate (prefix cache)"),
              ("ttft_uncached_s", "radixgate (no cache, recompute)")]
    series += [(f"{p}_ttft_s", f"{p} (own prefix cache)") for p in result.get("peers", [])]
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        rows = result[key]
        for column, label in series:
            ax.plot([r["context_len"] for r in rows], [r[column] for r in rows],
                    marker="o", markersize=3, label=label)
        ax.set(xlabel="context length (tokens)", ylabel="TTFT (s)", title=title, yscale="log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    hi = result["sweep"][-1]
    title = (f"{result.get('model', '')}: uncached/cached at {hi['context_len']} context "
             f"{hi['ttft_uncached_s'] / hi['ttft_cached_s']:.1f}x")
    if result["turns"]:
        title += f", hit rate over the replay {result['hit_rate']:.1%}"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")
