"""`benchmarks/gpu_check.sh --dry-run` works on CPU: the GPU script is ready when a GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=ROOT,
                          env={**os.environ, "OUT": str(tmp_path)}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["dry_run"] is True
    assert len(results["correctness"]) == 6 and all(r["ok"] for r in results["correctness"])
    assert {"decode_bw", "extend", "ttft", "decode"} <= results.keys()
    table = (tmp_path / "table.txt").read_text()
    assert "ERROR" not in table and table.rstrip() in proc.stdout
    tp = json.loads((tmp_path / "tp.json").read_text())  # --tp 2 (gloo on the CPU here)
    assert tp["equal"] is True and proc.stdout.rstrip().endswith("at tp 2 (cpu)")
