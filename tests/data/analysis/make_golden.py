"""Regenerate the analysis golden traces (tests/data/analysis/{fused,unfused}) and
their expected summaries (expected.json).

    .venv/bin/python tests/data/analysis/make_golden.py

Two 2-rank runs of the bundled training benchmark (SmallCNN, 6 gradient tensors,
13 recorded steps) under real Horovod + Open MPI, with tensor fusion on (default
threshold) and off (HOROVOD_FUSION_THRESHOLD=0).  Each profile keeps trace.json
(re-merged without events, so it stays small), ranks/*.parquet + .json and
Horovod's timeline.json; the raw files are dropped.  expected.json holds what
tests/test_compare.py checks with a tolerance: summaries computed by the analysis
layer on these stored traces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_hwloc_base_binding_policy": "none",
    "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo",
}
TRAIN = ["-m", "profiler.workloads.train_bench", "--model", "cnn", "--batch-size", "16",
         "--num-warmup-batches", "2", "--num-batches-per-iter", "2", "--num-iters", "6",
         "--quiet"]


def run(name: str, extra: dict[str, str]) -> Path:
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(MPI_ENV)
    env.update(extra)
    env.update({"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(out)})
    subprocess.run(["mpirun", "-n", "2", sys.executable, *TRAIN], env=env, check=True,
                   cwd="/tmp")
    subprocess.run([sys.executable, "-m", "profiler.cli", "merge", str(out), "--events", "0",
                    "-q"], check=True, cwd="/tmp")
    shutil.rmtree(out / "raw", ignore_errors=True)
    return out / "trace.json"


def expected(fused: Path, unfused: Path) -> dict[str, object]:
    from profiler.analysis import load
    from profiler.analysis.compare import compare
    from profiler.analysis.sizes import size_distribution
    from profiler.analysis.throughput import throughput_summary

    df = load(fused, unfused, label=["fused", "unfused"])
    sizes = size_distribution(df, bucket="exact")
    thr = throughput_summary(df)
    cmp = compare(df, baseline="fused")
    steps = cmp.loc[cmp["bucket"] == ""].set_index("metric")
    return {
        "data_calls": {lb: int(sizes.loc[sizes["label"] == lb, "calls"].sum())
                       for lb in ("fused", "unfused")},
        "data_bytes": {lb: int(sizes.loc[sizes["label"] == lb, "bytes"].sum())
                       for lb in ("fused", "unfused")},
        "unfused_sizes": sorted(int(s) for s in sizes.loc[sizes["label"] == "unfused", "size"]),
        "images_per_s": {str(r.label): float(r.images_per_s) for r in thr.itertuples()},
        "steps": {str(r.label): int(r.steps) for r in thr.itertuples()},
        "compare": {m: {"value": float(r["value"]), "baseline_value": float(r["baseline_value"])}
                    for m, r in steps.iterrows()},
    }


def main() -> int:
    fused = run("fused", {})
    unfused = run("unfused", {"HOROVOD_FUSION_THRESHOLD": "0"})
    (HERE / "expected.json").write_text(json.dumps(expected(fused, unfused), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
