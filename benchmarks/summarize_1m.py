"""`profiler summarize` on a 1M-call trace: wall time and peak memory.

Generates a synthetic job with tests/rawgen.py (raw files as the hooks write
them: R ranks, a main thread and Horovod's background thread, a Horovod-like
mix of gradient allreduces of many sizes, bit-vector control allreduces,
broadcasts and allgathervs), then measures, each in a fresh process:

  read        profiler.formats.raw.read_raw of one rank's raw file
  merge       `profiler merge DIR` (raw -> parquet for every rank + trace.json)
  summarize   `profiler summarize DIR/trace.json` (table to a pipe)
  json        `profiler summarize DIR/trace.json --format json --by op,bytes,rank`

Wall time is the median of --repeat runs; peak RSS is the child's ru_maxrss.
Targets (issue 2): summarize under 2 s and under 1 GB.  Not a test.

    .venv/bin/python benchmarks/summarize_1m.py [--calls 1000000] [--ranks 4]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import rawgen  # noqa: E402

from profiler.formats import record as F  # noqa: E402


def generate(d: Path, calls: int, ranks: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    per_rank = calls // ranks
    sizes = np.array([4, 64, 3000, 4096, 65536, 1 << 20, 4 << 20, 25 << 20, 98_304_000])
    for r in range(ranks):
        w = rawgen.RawWriter(rank=r, world_size=ranks, chunk_bytes=F.DEFAULT_CHUNK_BYTES,
                             clock_kind=1, ticks_per_ns=2.6, cal0=(1_000, 0),
                             cal1=(1_000 + 26_000_000_000, 10_000_000_000),
                             offset_ns=int(rng.integers(-500, 500)), job_t0_ns=0)
        w.add_comm(0xC0FFEE, ranks, r, "MPI_COMM_WORLD")
        main = w.add_track(1000 + r, is_main=True)
        hvd = w.add_track(2000 + r, name="python", caller="mpi_lib.cpython-311-x86_64.so")
        n = per_rank
        kind = rng.choice(4, size=n, p=[0.35, 0.55, 0.05, 0.05])  # grad, ctrl, bcast, agv
        op = np.select([kind == 0, kind == 1, kind == 2], [1, 1, 4], 6).astype(np.uint16)
        nbytes = np.where(kind == 1, 8, rng.choice(sizes, size=n)).astype(np.uint64)
        dur_ns = (2_000 + nbytes / 5.0 * rng.uniform(0.8, 1.5, n)).astype(np.uint64)
        start_ns = np.cumsum(dur_ns + rng.integers(500, 50_000, n).astype(np.uint64))
        ticks0 = (1_000 + start_ns * 2.6).astype(np.uint64)
        ticks1 = (1_000 + (start_ns + dur_ns) * 2.6).astype(np.uint64)
        recs = rawgen.records(
            n, t_start=ticks0, t_end=ticks1, bytes=nbytes, count=nbytes // 4,
            seq=np.arange(n), op=op, dtype=np.where(kind == 1, 12, 14),
            redop=np.where(kind == 1, 6, np.where(op == 1, 1, 0)), dtype_size=4,
            root=np.where(op == 4, 0, -1), flags=np.where(kind == 0, F.FLAG_IN_PLACE, 0))
        w.add(hvd, recs)
        w.add(main, rawgen.records(2, t_start=[0, int(ticks1[-1])], t_end=[1, int(ticks1[-1]) + 5],
                                   op=[14, 15]))
        w.write(d / "raw" / f"rank-{r:05d}.hvprof")


def measure(argv: list[str], repeat: int) -> tuple[float, float]:
    walls, peaks = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        walls.append(time.perf_counter() - t0)
        out = proc.stdout.read() if proc.stdout else b""
        err = proc.stderr.read() if proc.stderr else b""
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {err.decode()[-2000:]}")
        _ = out
        peaks.append(usage.ru_maxrss / 1024)  # KiB -> MiB
    return statistics.median(walls), max(peaks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", help="keep the generated profile here")
    args = ap.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hvprof-1m-"))
    if base.exists():
        shutil.rmtree(base)
    t0 = time.perf_counter()
    generate(base, args.calls, args.ranks)
    gen_s = time.perf_counter() - t0
    raw_mib = sum(p.stat().st_size for p in (base / "raw").iterdir()) / 2**20
    py = sys.executable
    print(f"generated {args.calls} calls on {args.ranks} ranks in {gen_s:.1f} s "
          f"({raw_mib:.0f} MiB raw)")
    read_code = ("import sys, time; from profiler.formats.raw import read_raw; "
                 "t=time.perf_counter(); r=read_raw(sys.argv[1]); "
                 "print(len(r.records), time.perf_counter()-t)")
    out = subprocess.run([py, "-c", read_code, str(base / "raw" / "rank-00000.hvprof")],
                         capture_output=True, text=True, check=True).stdout.split()
    print(f"read_raw: {int(out[0])} records in {float(out[1]) * 1e3:.0f} ms")
    cli = [py, "-m", "profiler.cli"]
    rows = []
    wall, peak = measure([*cli, "merge", str(base)], 1)
    rows.append(("merge (convert all ranks + trace.json)", wall, peak))
    trace = str(base / "trace.json")
    mib = (base / "trace.json").stat().st_size / 2**20
    pq = sum(p.stat().st_size for p in (base / "ranks").glob("*.parquet")) / 2**20
    for label, extra in [("summarize (table)", []),
                         ("summarize --format json --by op,bytes,rank",
                          ["--format", "json", "--by", "op,bytes,rank"])]:
        wall, peak = measure([*cli, "summarize", trace, *extra], args.repeat)
        rows.append((label, wall, peak))
    for label, wall, peak in rows:
        print(f"{label:48s} {wall:6.2f} s  {peak:7.0f} MiB peak RSS")
    print(f"trace.json {mib:.0f} MiB, parquet {pq:.0f} MiB")
    if not args.dir:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
