"""`profiler summarize --engine dask` on a large dataset with a local cluster of
several worker processes: its time and each worker's peak memory, so that a
site knows when to use it (benchmarks/, not a test).

The script starts a dask.distributed LocalCluster of --workers processes (one
thread each, --memory-limit each), then runs the command a user runs against
it, in a fresh process:

    profiler summarize DIR --engine dask --scheduler ADDRESS --format json

and reports its wall time and peak RSS (wait4), and every worker's peak RSS
(resource.getrusage in the worker, which started fresh with the cluster) and
the cluster's spill to disk.  Beside it, the same summary by the DuckDB engine
(`--engine duckdb`), in the same run.  --ranks N limits both to the first N
ranks (`--ranks 0-N-1`): the Dask engine reads every rank file's rows into its
shuffle, and the full 1024 x 100k dataset may not fit a small machine.

    .venv/bin/python benchmarks/scale_dask.py DIR [--workers 4] [--memory-limit 3GB]
        [--ranks N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PY = sys.executable


def run(cmd: list[str], label: str) -> dict[str, Any]:
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=tempfile.gettempdir())
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        rc = os.waitstatus_to_exitcode(status)
        err.seek(0)
        if rc != 0:
            raise SystemExit(f"{label} failed ({rc}):\n{err.read().decode()[-3000:]}")
        out.seek(0)
        rows = json.loads(out.read().decode())
    res = {"label": label, "wall_s": round(wall, 2), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
           "peak_rss_gb": round(ru.ru_maxrss / 2**20, 3), "load_before": round(load, 2),
           "load_after": round(os.getloadavg()[0], 2), "groups": len(rows),
           "calls": int(sum(r["calls"] for r in rows))}
    print(f"{label:<34} {wall:8.2f} s wall {res['cpu_s']:8.2f} s CPU (this process)  "
          f"peak RSS {res['peak_rss_gb']:6.3f} GB  {res['calls']} calls  load "
          f"{res['load_before']:.1f} -> {res['load_after']:.1f}", flush=True)
    return res


def worker_peaks(client: Any) -> dict[str, float]:
    def peak() -> float:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {str(k): round(float(v), 3) for k, v in client.run(peak).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--memory-limit", default="3GB", help="per worker (Dask spills past it)")
    ap.add_argument("--ranks", type=int, default=0, help="the first N ranks only (0: all)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import logging

    from dask.distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    sel = ["--ranks", f"0-{args.ranks - 1}"] if args.ranks else []
    base = [PY, "-P", "-m", "profiler.cli", "summarize", str(args.dir), "--format", "json", *sel]
    results: dict[str, Any] = {"dir": str(args.dir), "workers": args.workers,
                               "memory_limit": args.memory_limit, "ranks": args.ranks or "all"}
    results["duckdb"] = run([*base, "--engine", "duckdb"], "summarize --engine duckdb")
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      memory_limit=args.memory_limit, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        before = worker_peaks(client)
        results["dask"] = run([*base, "--engine", "dask", "--scheduler", cluster.scheduler_address],
                              f"summarize --engine dask ({args.workers} workers)")
        results["dask"]["worker_peak_rss_gb"] = peaks = worker_peaks(client)
        results["dask"]["worker_rss_at_start_gb"] = before
        for w, gb in peaks.items():
            print(f"  worker {w}: peak RSS {gb:.3f} GB (at start {before.get(w, 0):.3f})")
    same = (results["dask"]["calls"] == results["duckdb"]["calls"]
            and results["dask"]["groups"] == results["duckdb"]["groups"])
    print(f"same calls and groups as DuckDB: {same}")
    results["same_as_duckdb"] = same
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
