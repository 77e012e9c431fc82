"""Analysis at scale: load + summarize + report on traces of 1M and 10M calls.

Generates a Horovod-like job straight into the columnar format (ranks/*.parquet
through profiler.formats.dataset.frame_to_table, trace.json through
profiler.formats.tracejson.write_trace without events): R ranks, each with training
steps (APP_STEP rows with images), per step a burst of gradient allreduces of
many sizes (powers of two and in-between, fused and unfused-like) on Horovod's
thread, bit-vector control allreduces, and matching (comm, seq) across ranks.
Then measures, each in a fresh process (wall = median of --repeat runs, peak
RSS = the child's ru_maxrss):

  load        profiler.analysis.load(trace) -> DataFrame (all columns)
  summarize   load (the columns summarize needs) + summarize(by op, bucket)
  advise      profiler.analysis.findings.advise(trace) (every analyzer)
  report      profiler.analysis.report.write_report(trace) (every section)

Targets (issue 4): 1M calls loaded and summarized in < 2 s; 10M in < 20 s and
< 4 GB.  Issue 12: advise of 1M calls < 2 s and < 1 GB.  Not a test.

    .venv/bin/python benchmarks/analysis_scale.py [--calls 1000000 10000000] [--ranks 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

SIZES = np.array([4, 64, 1000, 3072, 4096, 12288, 65536, 98304, 1 << 20, 3 << 19, 4 << 20,
                  25 << 20], dtype=np.int64)
COLUMNS_SUMMARIZE = ["rank", "backend", "op", "bytes", "dur_ns", "comm_size", "kind", "device",
                     "t_start_ns", "t_end_ns"]


def rank_frame(rank: int, ranks: int, calls: int, rng: np.random.Generator) -> pd.DataFrame:
    """One rank's rows: steps of (control calls, data burst), plus APP_STEP rows."""
    per_step = 40  # calls per step: 15 control + 25 data
    steps = max(1, calls // per_step)
    n = steps * per_step
    pos = np.arange(n) % per_step
    step = np.arange(n) // per_step
    is_ctrl = pos < 15
    nbytes = np.where(is_ctrl, 8, SIZES[rng.integers(0, SIZES.size, n)])
    base = 2_000 + nbytes / 5.0  # ns: 2 us + 5 GB/s
    spike = ~np.isin(nbytes, [4, 64, 4096, 65536, 1 << 20, 4 << 20]) & ~is_ctrl
    dur = (base * np.where(spike, 1.8, 1.0) * rng.lognormal(0, 0.1, n)).astype(np.int64)
    gap = np.where(pos == 15, 2_000_000, rng.integers(1_000, 20_000, n))  # idle before burst
    t0 = np.cumsum(dur + gap) - dur + rng.integers(0, 3_000, n) * (rank > 0)
    t1 = t0 + dur
    step_start = np.r_[0, t1[per_step - 1::per_step][:-1] + 1]
    step_end = t1[per_step - 1::per_step] + 50_000
    cat = pd.Categorical
    m = steps
    df = pd.DataFrame({
        "rank": np.full(n + m, rank, np.int32),
        "backend": cat(["mpi"] * n + ["app"] * m),
        "op": cat(["allreduce"] * n + ["step"] * m),
        "t_start_ns": np.r_[t0, step_start].astype(np.int64),
        "t_end_ns": np.r_[t1, step_end].astype(np.int64),
        "dur_ns": np.r_[dur, step_end - step_start].astype(np.int64),
        "bytes": np.r_[nbytes, np.zeros(m)].astype(np.int64),
        "count": np.r_[nbytes // np.where(is_ctrl, 8, 4), np.full(m, 64)].astype(np.int64),
        "dtype": cat(np.r_[np.where(is_ctrl, "MPI_LONG_LONG_INT", "MPI_FLOAT"),
                           np.full(m, "unknown")]),
        "dtype_size": np.r_[np.where(is_ctrl, 8, 4), np.zeros(m)].astype(np.int32),
        "redop": cat(np.r_[np.where(is_ctrl, "band", "sum"), np.full(m, "none")]),
        "flags": np.zeros(n + m, np.int32),
        "in_place": np.r_[~is_ctrl, np.zeros(m, bool)],
        "device": np.zeros(n + m, bool),
        "rc": np.zeros(n + m, np.int16),
        "comm": np.r_[np.full(n, 0xC0FFEE), np.zeros(m)].astype(np.uint64),
        "comm_size": np.full(n + m, ranks, np.int32),
        "comm_rank": np.full(n + m, rank, np.int32),
        "comm_name": cat(["MPI_COMM_WORLD"] * n + [""] * m),
        "root": np.full(n + m, -1, np.int32),
        "seq": np.r_[np.arange(n), np.arange(m)].astype(np.int64),
        "track": np.r_[np.ones(n), np.zeros(m)].astype(np.int32),
        "tid": np.r_[np.full(n, 2000 + rank), np.full(m, 1000 + rank)].astype(np.int32),
        "thread_kind": cat(["horovod"] * n + ["main"] * m),
        "thread_name": cat(["python"] * (n + m)),
        "group": np.zeros(n + m, np.int32),
        "kind": cat(np.r_[np.where(is_ctrl, "control", "data"), np.full(m, "app")]),
        "step": np.r_[step, np.arange(m)].astype(np.int32),
    })
    return df


def generate(d: Path, calls: int, ranks: int, seed: int = 0) -> None:
    import pyarrow.parquet as pq

    from profiler.formats.dataset import frame_to_table
    from profiler.postjob.window import write_trace

    rng = np.random.default_rng(seed)
    (d / "ranks").mkdir(parents=True, exist_ok=True)
    files = []
    total = 0
    for r in range(ranks):
        df = rank_frame(r, ranks, calls // ranks, rng)
        total += len(df)
        f = d / "ranks" / f"rank-{r:05d}.parquet"
        pq.write_table(frame_to_table(df), f, compression="zstd")
        files.append(f"ranks/{f.name}")
    meta = {"command": ["synthetic", "analysis_scale"], "hosts": ["bench"],
            "world_size": ranks, "missing_ranks": [], "partial_ranks": [],
            "ranks": [{"rank": r, "host": "bench"} for r in range(ranks)],
            "env": {"OMPI_MCA_btl": "vader,self"},
            "dataset": {"format": "parquet", "files": files, "calls": total, "rows": total}}
    write_trace(d / "trace.json", meta, [], [], limit=0)


STEP = {
    "load": "from profiler.analysis import load; df = load({t!r}); print(len(df))",
    "summarize": ("from profiler.analysis import load, summarize; "
                  f"df = load({{t!r}}, columns={COLUMNS_SUMMARIZE!r}); "
                  "print(len(summarize(df, by=['op', 'bucket'])))"),
    "advise": ("from profiler.analysis.findings import advise; "
               "print(len(advise({t!r}).findings))"),
    "report": ("from profiler.analysis.report import write_report; "
               "write_report([{t!r}], {o!r}, progress=False)"),
}


def measure(code: str, repeat: int) -> tuple[float, float]:
    walls, peaks = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        walls.append(time.perf_counter() - t0)
        err = proc.stderr.read() if proc.stderr else b""
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"failed: {code}\n{err.decode()[-3000:]}")
        peaks.append(usage.ru_maxrss / 1024.0)  # KiB -> MiB
    return statistics.median(walls), max(peaks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", nargs="+", default=list(STEP), choices=list(STEP))
    ap.add_argument("--keep", default=None, help="keep the generated traces under this dir")
    args = ap.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hvprof-scale-"))
    print(f"{'calls':>12} {'step':>10} {'wall s':>8} {'peak MiB':>9}")
    try:
        for calls in args.calls:
            d = root / f"c{calls}"
            if not (d / "trace.json").is_file():
                t0 = time.perf_counter()
                generate(d, calls, args.ranks)
                print(f"# generated {calls:,} calls in {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr)
            for step in args.steps:
                code = STEP[step].format(t=str(d / "trace.json"), o=str(d / "report.html"))
                wall, peak = measure(code, args.repeat if step != "report" else 1)
                print(f"{calls:>12,} {step:>10} {wall:>8.2f} {peak:>9.0f}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
