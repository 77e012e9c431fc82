#!/usr/bin/env python3
"""Where a step's CPU goes, by thread and library, from perf_steady.sh's
recordings (benchmarks/, not a test).

    python benchmarks/overhead/perf_by_thread.py [/tmp/ps]

For each recording DIR/ARM-I.data (perf's cpu-clock on rank 0 over 4 s,
4,999 samples a second) and the job's RESULT line in DIR/ARM-I.out (its
steps/s): the main thread (the one with the most libtorch_cpu samples) by
library, and every other thread by name, in us of CPU a step; then the
median of each arm's runs.  With ranks bound to one core each, a rank's
step is about the sum of its threads' CPU: what Horovod's background
thread spends polling MPI while the peer is late is taken from the main
thread's core.
"""

from __future__ import annotations

import collections
import re
import statistics
import subprocess
import sys
from pathlib import Path

RATE_HZ = 4999
WINDOW_S = 4.0
LINE = re.compile(r"\s*[\d.]+%\s+(\d+)\s+(\d+):(\S+)\s+(.+?)\s*$")


def library(dso: str) -> str:
    for key, name in (("libpython", "python"), ("hvprof", "profiler"), ("fastrec", "profiler"),
                      ("kernel", "kernel"), ("torch", "torch"), ("c10", "torch"),
                      ("libc.so", "libc"), ("vader", "mpi"), ("open-pal", "mpi"),
                      ("libmpi", "mpi"), ("mca_", "mpi"), ("mpi_lib", "horovod")):
        if key in dso:
            return name
    return "other"


def one(data: Path) -> dict[str, float] | None:
    out = data.with_suffix(".out")
    m = re.search(r'"steps_per_s": ([0-9.]+)', out.read_text()) if out.exists() else None
    if m is None:
        return None
    steps = WINDOW_S * float(m[1])
    rep = subprocess.run(["perf", "report", "-i", str(data), "-n", "-s", "pid,dso", "--stdio"],
                         capture_output=True, text=True).stdout
    rows = [(int(g[1]), g[2], g[3], g[4]) for g in map(LINE.match, rep.splitlines()) if g]
    torch = collections.Counter({tid: n for n, tid, _, dso in rows if "libtorch_cpu" in dso})
    if not torch:
        return None
    main = torch.most_common(1)[0][0]
    cell: collections.Counter[str] = collections.Counter()
    for n, tid, comm, dso in rows:
        key = f"main: {library(dso)}" if tid == main else f"other: {comm} {library(dso)}"
        cell[key] += n
    per = {k: v / RATE_HZ / steps * 1e6 for k, v in cell.items()}
    per["main: all"] = sum(v for k, v in per.items() if k.startswith("main: "))
    per["other: all"] = sum(v for k, v in per.items() if k.startswith("other: "))
    per["steps/s"] = float(m[1])
    return per


def main(argv: list[str]) -> int:
    d = Path(argv[0] if argv else "/tmp/ps")
    arms: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    for data in sorted(d.glob("*-*.data")):
        got = one(data)
        if got is not None:
            arms[data.stem.rsplit("-", 1)[0]].append(got)
    if not arms:
        print(f"perf_by_thread: no recordings with a RESULT line in {d}", file=sys.stderr)
        return 2
    keys = sorted({k for runs in arms.values() for r in runs for k in r})
    names = sorted(arms)
    print(f"{'us of CPU a step (median of runs)':44s}" + "".join(f"{a:>12s}" for a in names))
    for k in keys:
        vals = [statistics.median(r.get(k, 0.0) for r in arms[a]) for a in names]
        if max(vals) >= 1.0:
            print(f"{k:44s}" + "".join(f"{v:12.1f}" for v in vals))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
