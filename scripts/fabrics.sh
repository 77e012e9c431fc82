#!/usr/bin/env bash
# Traces for notebooks/01_interconnect_comparison.ipynb on emulated fabrics:
# shared memory, and TCP over veth between 2 simulated hosts (unlimited, tbf
# 10 Gbit/s, tbf 1 Gbit/s): an allreduce sweep and the application's replay on
# each, the fitted latency/bandwidth and the predicted communication per step.
#
#   bash scripts/fabrics.sh out/fabrics            # full (about 5 minutes, root)
#   bash scripts/fabrics.sh out/fabrics --quick    # few sizes and calls
#
# Then set FABRIC_DIR = "out/fabrics" at the top of the notebook.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY=python3
exec "$PY" -P -m profiler.bench.fabrics "${@:-out/fabrics}"
