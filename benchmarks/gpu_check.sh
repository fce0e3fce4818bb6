#!/usr/bin/env bash
# One GPU check that fits in 8 minutes on one H200; everything lands under $OUT.
#   OUT=/some/dir bash benchmarks/gpu_check.sh            # on the lent GPU machine
#   bash benchmarks/gpu_check.sh --dry-run                # CPU, tiny shapes, seconds
# Uses the machine's own python3 (torch + triton, no pip); a local .venv is preferred when present.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d -t gpu_check.XXXXXX)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
echo "gpu_check: python=$PY out=$OUT" >&2
if [ "${1:-}" != "--dry-run" ]; then nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true; fi
# 470 s hard stop leaves room inside 8 minutes; the script itself skips sections past 450 s.
timeout 470 "$PY" benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
status="${PIPESTATUS[0]}"
# --tp 2 over NCCL where the machine has two GPUs (it says "skipped" on one).
timeout 240 "$PY" benchmarks/gpu_check_tp.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check_tp.log"
tp_status="${PIPESTATUS[0]}"
exit $(( status != 0 ? status : tp_status ))
