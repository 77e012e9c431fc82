"""What Horovod's timeline costs, and what the profiler costs without it.

Images/sec of the bundled benchmark (profiler.workloads.train_bench) at 2
local ranks under mpirun, four configurations run alternately in one sitting
(round r runs all four, in an order rotated by r, so that drift of the machine
spreads over all of them):

  unprofiled         plain Horovod
  profiled           HOROVOD_PROFILE=1 (the default: no Horovod timeline; the
                     lineage from the profiler's own records)
  profiled+timeline  HOROVOD_PROFILE=1, HOROVOD_PROFILE_TIMELINE=1 (the hooks
                     point HOROVOD_TIMELINE into the profile directory)
  timeline only      HOROVOD_TIMELINE=<tmp>/timeline.json, no profiler
  timeline idle      HOROVOD_TIMELINE=DYNAMIC, no profiler, never started: what
                     a bounded window (hvd.start_timeline / stop_timeline for a
                     few steps) costs outside the window.  DYNAMIC is what
                     start_timeline needs (horovod_start_timeline returns -2
                     without HOROVOD_TIMELINE at init), and it starts the
                     writer thread at hvd.init (operations.cc, timeline.cc
                     Initialize("")): WriterLoop spins while healthy, with or
                     without a file, and stop_timeline leaves it healthy

Each run's figure is train_bench's total images/sec (mean over its timed
iterations); a configuration's figure is the median over rounds, with the
min-max spread.  Noise: the unprofiled runs' spread across rounds, relative to
their median.  The 1-minute load average before each run is recorded: on a
shared machine, figures taken under other load are not comparable.
Target (issue 3): profiled >= 99% of unprofiled.  Not a test.

    .venv/bin/python benchmarks/timeline_cost.py [--rounds 3] [--model resnet8]
        [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS = ("unprofiled", "profiled", "profiled+timeline", "timeline only", "timeline idle")

MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
}


def config_env(name: str, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_PROFILE", "HOROVOD_TIMELINE"))}
    env.update(MPI_ENV)
    # Bounds rank 0's wait for the others' datasets at exit (after the timed part).
    env["HOROVOD_PROFILE_MERGE_TIMEOUT"] = "20"
    if name == "profiled":
        env.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(work / "prof"))
    elif name == "profiled+timeline":
        env.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_TIMELINE="1",
                   HOROVOD_PROFILE_DIR=str(work / "prof"))
    elif name == "timeline only":
        env.update(HOROVOD_TIMELINE=str(work / "timeline.json"))
    elif name == "timeline idle":
        env.update(HOROVOD_TIMELINE="DYNAMIC")
    return env


def wait_quiet(max_load: float | None, limit_s: float = 300.0) -> None:
    """Wait (bounded) until the 1-minute load average drops below max_load."""
    if max_load is None:
        return
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(5)


def run_once(name: str, args: argparse.Namespace, np_: int) -> dict[str, Any]:
    wait_quiet(args.max_load)
    work = Path(tempfile.mkdtemp(prefix="hvprof-tlcost-"))
    try:
        cmd = ["mpirun", "-n", str(np_), sys.executable, "-m", "profiler.workloads.train_bench",
               "--model", args.model, "--batch-size", str(args.batch_size),
               "--image-size", str(args.image_size),
               "--num-warmup-batches", str(args.warmup),
               "--num-batches-per-iter", str(args.batches_per_iter),
               "--num-iters", str(args.iters), "--quiet"]
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=config_env(name, work), cwd=work, capture_output=True,
                              text=True, timeout=args.timeout)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"timeline_cost: {name} run failed ({proc.returncode}):\n"
                             f"{proc.stderr[-3000:]}")
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            raise SystemExit(f"timeline_cost: {name}: no RESULT line:\n{proc.stdout[-2000:]}")
        result = json.loads(lines[-1][len("RESULT "):])
        tl = [p for p in (work / "timeline.json", work / "prof" / "timeline.json") if p.exists()]
        return {
            "config": name,
            "images_per_sec": float(result["images_per_sec"]),
            "ci95": float(result["images_per_sec_ci95"]),
            "wall_s": wall,
            "load_before": load_before,
            "timeline_bytes": tl[0].stat().st_size if tl else 0,
            "gradient_tensors": result.get("gradient_tensors"),
            "timed_steps": result.get("timed_steps"),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    for r in runs:
        by[r["config"]].append(r)
    base = statistics.median(r["images_per_sec"] for r in by["unprofiled"])
    out: dict[str, Any] = {}
    for c, rs in by.items():
        vals = [r["images_per_sec"] for r in rs]
        med = statistics.median(vals)
        out[c] = {
            "median": med,
            "min": min(vals),
            "max": max(vals),
            "runs": vals,
            "vs_unprofiled": med / base if base else float("nan"),
            "timeline_bytes": max(r["timeline_bytes"] for r in rs),
        }
    u = by["unprofiled"]
    noise = (max(r["images_per_sec"] for r in u) - min(r["images_per_sec"] for r in u)) / base
    return {"configs": out, "noise": noise}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--model", default="resnet8")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batches-per-iter", type=int, default=5)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--max-load", type=float, metavar="L",
                   help="before each run, wait (up to 5 min) for the 1-min load average < L")
    p.add_argument("--json", metavar="PATH", help="write all runs and the summary as JSON")
    args = p.parse_args(argv)
    if shutil.which("mpirun") is None:
        print("timeline_cost: mpirun not found", file=sys.stderr)
        return 2

    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = CONFIGS[rnd % len(CONFIGS):] + CONFIGS[:rnd % len(CONFIGS)]
        for name in order:
            r = run_once(name, args, args.np)
            r["round"] = rnd
            runs.append(r)
            print(f"round {rnd} {name:18s} {r['images_per_sec']:9.1f} img/s "
                  f"(+-{r['ci95']:.1f})  wall {r['wall_s']:.1f} s  load {r['load_before']:.1f}"
                  + (f"  timeline {r['timeline_bytes'] / 1e6:.2f} MB"
                     if r["timeline_bytes"] else ""), flush=True)
    s = summarize(runs)
    print()
    print(f"{args.model}, batch {args.batch_size}, image {args.image_size}, {args.np} ranks, "
          f"{args.rounds} rounds; run-to-run noise (unprofiled max-min)/median: "
          f"{100 * s['noise']:.1f}%")
    print(f"{'configuration':18s} {'median img/s':>12s} {'min':>9s} {'max':>9s} "
          f"{'vs unprofiled':>13s}")
    for c in CONFIGS:
        v = s["configs"][c]
        print(f"{c:18s} {v['median']:12.1f} {v['min']:9.1f} {v['max']:9.1f} "
              f"{100 * v['vs_unprofiled']:12.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs, "summary": s},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
