"""What the per-step CPU figures cost (hooks/cpu.c): at every step record the
library reads /proc/self/task/<tid>/schedstat of each thread track and writes
one APP_CPU record per thread.

    python benchmarks/cpu_read_cost.py [--threads 2,3,4] [--steps 2000] [--rounds 7]
    python benchmarks/cpu_read_cost.py --cold 1000 --steps 200

For each number of thread tracks (the main thread plus workers that made one
MPI call and stay alive), one profiled 1-rank process (mpirun, mpi4py)
alternates blocks of step records (hvprof_record_app(APP_STEP): the record
plus the reads) and of mark records (APP_MARK: the same record path, no
reads), and prints per step:

* added: the median over rounds of (a step block's time - a mark block's
  time) / steps, on the wall clock and on the stepping thread's CPU clock
  (--cold: the median step record's time - the median mark record's, each
  record after a matrix product that leaves the caches cold);
* library: the stepping thread's CPU time in the reads and their records, as
  the library counts it (the cpu sidecar's step_read_cpu_ns / steps);
* read_cost_ns: the library's start-up measure of one read (median of 9),
  which the trace metadata carries.

One JSON line per thread count follows the table (`RESULT {...}`).  Not a
test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, statistics, sys, threading, time
from mpi4py import MPI
from profiler.collect import native

n_threads, steps, rounds, cold = (int(a) for a in sys.argv[1:5])
comm = MPI.COMM_WORLD
lib = native.Functions(native.load())
go = threading.Event()
ready = []

def worker():
    comm.Barrier()          # one record: the thread has a track
    ready.append(1)
    go.wait()

workers = [threading.Thread(target=worker) for _ in range(n_threads - 1)]
for w in workers:
    w.start()
while len(ready) < len(workers):
    time.sleep(0.01)
comm.Barrier()              # the main thread's track
STEP, MARK = 32, 33
seq = 0

def block(op):
    global seq
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(steps):
        t = lib.now()
        lib.record_app(op, t, t, 0, seq)
        seq += 1
    return time.perf_counter_ns() - w0, time.thread_time_ns() - c0

wall, cpu = [], []
if cold:
    # one record at a time, a matrix product between them (caches and TLBs
    # left cold, as a training step leaves them): medians of each op's
    # records, steps and marks alternating
    import numpy as np
    a = np.random.default_rng(0).random((cold, cold))
    got = {STEP: ([], []), MARK: ([], [])}
    for i in range(2 * steps):
        a @ a
        op = STEP if i % 2 else MARK
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        t = lib.now()
        lib.record_app(op, t, t, 0, i)
        got[op][0].append(time.perf_counter_ns() - w0)
        got[op][1].append(time.thread_time_ns() - c0)
    wall = [statistics.median(got[STEP][0]) - statistics.median(got[MARK][0])]
    cpu = [statistics.median(got[STEP][1]) - statistics.median(got[MARK][1])]
else:
    block(STEP); block(MARK)    # warm-up
    for r in range(rounds):
        order = (STEP, MARK) if r % 2 == 0 else (MARK, STEP)
        got = {op: block(op) for op in order}
        wall.append((got[STEP][0] - got[MARK][0]) / steps)
        cpu.append((got[STEP][1] - got[MARK][1]) / steps)
go.set()
for w in workers:
    w.join()
print("CHILD " + json.dumps({"wall_ns": statistics.median(wall), "cpu_ns": statistics.median(cpu),
                             "wall_rounds": wall, "cpu_rounds": cpu}), flush=True)
"""

MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_hwloc_base_binding_policy": "none",
    "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo",
}


def run(n_threads: int, steps: int, rounds: int, cold: int, tmp: Path) -> dict[str, object]:
    prof = tmp / f"prof-{n_threads}"
    env = {**os.environ, **MPI_ENV, "HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
           "HOROVOD_PROFILE_MERGE": "0"}
    p = subprocess.run(["mpirun", "-n", "1", sys.executable, "-c", CHILD, str(n_threads),
                        str(steps), str(rounds), str(cold)], env=env, capture_output=True,
                       text=True,
                       timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("CHILD ")]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"run with {n_threads} threads failed ({p.returncode}):\n"
                         f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    child = json.loads(lines[0][len("CHILD "):])
    side = json.loads((prof / "raw" / "rank-00000.cpu.json").read_text())
    per_step = side["step_read_cpu_ns"] / side["steps"] if side.get("steps") else None
    rows_per_step = side["rows"] / side["steps"] if side.get("steps") else None
    return {"threads": n_threads, "added_wall_ns": child["wall_ns"],
            "added_cpu_ns": child["cpu_ns"], "library_cpu_ns": per_step,
            "rows_per_step": rows_per_step, "read_cost_ns": side.get("read_cost_ns"),
            "loadavg": side.get("loadavg_end")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="2,3,4", help="thread tracks per run (default 2,3,4)")
    ap.add_argument("--steps", type=int, default=2000, help="step records per block")
    ap.add_argument("--rounds", type=int, default=7, help="step/mark block pairs")
    ap.add_argument("--cold", type=int, default=0, metavar="N",
                    help="one record at a time with an N x N matrix product between "
                         "records (cold caches, as inside a training job); --steps "
                         "records of each op (default 0: blocks of records, warm)")
    args = ap.parse_args(argv)
    if shutil.which("mpirun") is None:
        raise SystemExit("mpirun not found")
    results = []
    with tempfile.TemporaryDirectory() as d:
        for n in (int(x) for x in args.threads.split(",")):
            results.append(run(n, args.steps, args.rounds, args.cold, Path(d)))
    print(f"{'threads':>7}  {'added wall':>11}  {'added CPU':>10}  {'library CPU':>11}  "
          f"{'rows/step':>9}  {'one read':>9}")
    for r in results:
        lib = r["library_cpu_ns"]
        print(f"{r['threads']:>7}  {r['added_wall_ns'] / 1e3:>8.2f} us  "
              f"{r['added_cpu_ns'] / 1e3:>7.2f} us  "
              f"{(lib or 0) / 1e3:>8.2f} us  {r['rows_per_step'] or 0:>9.1f}  "
              f"{r['read_cost_ns']:>6} ns")
    for r in results:
        print("RESULT " + json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
