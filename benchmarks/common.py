"""Shared benchmark plumbing: machine notes, medians, tables, JSON and PNG output."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.cpu_class import cpu_class

if TYPE_CHECKING:
    from engine.models.loader import LoadedModel

THREADS = 2


def log(message: str) -> None:
    """Progress goes to stderr so stdout keeps only the tables."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def machine_notes(gguf_path: Path | None = None) -> dict[str, Any]:
    """Date, CPU, threads, load, package versions and the GGUF hash, recorded with every result."""
    notes: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": _cpu_model(),
        "cpu_class": cpu_class(),
        "num_cpus": os.cpu_count(),
        "threads": THREADS,
        "load_avg_before": os.getloadavg()[0],
        "versions": {p: _version(p) for p in ("torch", "llama-cpp-python", "openvino-genai",
                                              "transformers", "radixgate")},
    }
    if gguf_path is not None:
        notes["gguf"] = {"file": gguf_path.name, "sha256": file_sha256(gguf_path)}
    return notes


def load_default_model() -> LoadedModel:
    """The embedded GGUF in the precision `serve --dtype auto` picks on this CPU (mixed bf16
    projections where the CPU has bf16 instructions, else fp32), with packed decode weights
    where the kernel is built: the default mode."""
    from engine.models.loader import default_dtype, load_model

    return load_model(None, default_dtype("cpu"))


def precision_label(loaded: LoadedModel) -> str:
    """What a results table says the engine ran, e.g. "fp32; weights: gguf codes (<= 16
    rows), onednn extends"."""
    model = loaded.model
    return f"{model.precision_name}; weights: {model.weights_name}"


def finish_notes(notes: dict[str, Any]) -> None:
    notes["load_avg_after"] = os.getloadavg()[0]
    notes["loaded"] = max(notes["load_avg_before"], notes["load_avg_after"]) > THREADS + 0.5


def load_line(notes: dict[str, Any]) -> str:
    """The line each result table ends with: the 1-minute load around the run, and whether
    the figures are comparable (a run on a loaded machine is recorded, never refused)."""
    before, after = notes["load_avg_before"], notes.get("load_avg_after", notes["load_avg_before"])
    line = f"machine load (1-min average) {before:.2f} before, {after:.2f} after, {THREADS} threads"
    if notes.get("loaded"):
        return line + ("\nNOTE: the machine was loaded during the run; "
                       "the figures are not comparable.")
    return line + ": comparable"


def median_of(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
        return "-" if value is None else str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    sep = "-+-".join("-" * w for w in widths)
    body = [" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([line, sep, *body])


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    log(f"wrote {path}")


def model_tag(model: str) -> str:
    """A --model name or GGUF path as a file-name part: "qwen2.5-coder-1.5b" stays whole (no
    `Path.stem`, which would cut ".5b"), "/x/model.gguf" gives "model"."""
    return Path(model).name.removesuffix(".gguf")


def plot_path(json_path: Path) -> Path:
    return json_path.with_suffix(".png")


def publish(json_path: Path, result: dict[str, Any], table: str,
            plot: Callable[[dict[str, Any], Path], None]) -> None:
    """Print `table` (with a note when `result["machine"]` was loaded), and write the JSON,
    the table as text beside it and the PNG plot."""
    table += "\n" + load_line(result["machine"])
    print(table)
    write_json(json_path, result)
    json_path.with_suffix(".txt").write_text(table + "\n")
    plot(result, plot_path(json_path))
