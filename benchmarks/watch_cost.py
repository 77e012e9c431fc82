"""The watcher's CPU per refresh (`profiler watch`), on synthetic raw files.

R ranks (tests/rawgen.py: a main thread with steps and gradient allreduces of
several sizes, Horovod's thread with bit-vector control allreduces and
broadcasts) grow by --per-second records per rank between refreshes, as a job
making that many calls a second would, in the library's default 256 KiB
chunks.  Each refresh is Watcher.refresh() + snapshot(), measured with
time.process_time (this process's CPU), after a first refresh that reads the
files' start.  The step breakdown is split every BREAKDOWN_EVERY_S seconds, so
most refreshes do not split; the refresh that does is measured apart (the
"with split" column: the breakdown forced at every refresh).  Also the cost of
a refresh with nothing new (an idle job) and the Prometheus exposition of one
snapshot.  Not a test.

    .venv/bin/python benchmarks/watch_cost.py [--ranks 2 64] [--per-second 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import rawgen  # noqa: E402

from profiler.analysis import live  # noqa: E402
from profiler.analysis.live import Watcher  # noqa: E402
from profiler.formats import record as F  # noqa: E402


def rank_image(rank: int, world: int, seconds: int, per_second: int) -> bytes:
    rng = np.random.default_rng(rank)
    w = rawgen.RawWriter(rank=rank, world_size=world, chunk_bytes=F.DEFAULT_CHUNK_BYTES,
                         state=F.STATE_OPEN | F.STATE_MPI_INIT)
    w.add_comm(0x5EED, world, rank, "MPI_COMM_WORLD")
    main = w.add_track(1000 + rank, is_main=True)
    hvd = w.add_track(2000 + rank, name="mpi_lib")
    n = seconds * per_second
    n_hvd = n // 2
    n_main = n - n_hvd
    t = np.sort(rng.integers(0, seconds * 10**9, n_main)).astype(np.uint64)
    sizes = rng.choice([4 << 10, 256 << 10, 4 << 20, 16 << 20], n_main)
    ops = np.where(np.arange(n_main) % 20 == 0, rawgen.op("step"), rawgen.op("allreduce"))
    w.add(main, rawgen.records(n_main, t_start=t, t_end=t + rng.integers(1000, 10**6, n_main),
                               bytes=sizes, count=np.where(ops == rawgen.op("step"), 32,
                                                           sizes // 4),
                               seq=np.arange(n_main), op=ops, dtype=rawgen.dtype("MPI_FLOAT"),
                               redop=rawgen.redop("sum"), dtype_size=4))
    t2 = np.sort(rng.integers(0, seconds * 10**9, n_hvd)).astype(np.uint64)
    w.add(hvd, rawgen.records(n_hvd, t_start=t2, t_end=t2 + 20_000, bytes=8, count=1,
                              seq=np.arange(n_hvd), op=rawgen.op("allreduce"),
                              dtype=rawgen.dtype("MPI_LONG_LONG_INT"),
                              redop=rawgen.redop("band"), dtype_size=8, flags=F.FLAG_IN_PLACE))
    return w.to_bytes()


def measure(ranks: int, seconds: int, per_second: int, repeat: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="watch-cost-") as tmp:
        d = Path(tmp)
        (d / "raw").mkdir()
        images = [rank_image(r, ranks, seconds, per_second) for r in range(ranks)]
        step = [len(im) // (repeat + 2) for im in images]

        def write(k: int) -> None:
            for r, im in enumerate(images):
                end = len(im) if k >= repeat + 1 else F.HEADER_BYTES + 4096 + step[r] * (k + 1)
                (d / "raw" / f"rank-{r:05d}.hvprof").write_bytes(im[:max(end, 8192)])

        write(0)
        w = Watcher(d)
        w.refresh()
        w.snapshot()
        grow, idle, snap_cpu = [], [], []
        split: list[float] = []
        every = live.BREAKDOWN_EVERY_S
        for k in range(1, repeat + 1):
            write(k)
            live.BREAKDOWN_EVERY_S = 0.0 if k % 2 else every  # alternate: split / not
            c0 = time.process_time()
            w.refresh()
            c1 = time.process_time()
            w.snapshot()
            c2 = time.process_time()
            live.BREAKDOWN_EVERY_S = every
            (split if k % 2 else grow).append(c2 - c0)
            snap_cpu.append(c2 - c1)
            c0 = time.process_time()
            w.refresh()
            w.snapshot()
            idle.append(time.process_time() - c0)
        records = w.snapshot()["job"]["calls"]
        from prometheus_client import generate_latest

        from profiler.cli._prometheus import make_registry

        reg = make_registry(w, threading.Lock())
        c0 = time.process_time()
        text = generate_latest(reg)
        prom = time.process_time() - c0
        w.close()
        new_per_refresh = sum(step) / F.RECORD_BYTES / ranks
    return {"ranks": ranks, "records_per_rank_per_refresh": new_per_refresh,
            "refresh_cpu_ms": statistics.median(grow) * 1e3,
            "split_refresh_cpu_ms": statistics.median(split) * 1e3,
            "snapshot_cpu_ms": statistics.median(snap_cpu) * 1e3,
            "idle_refresh_cpu_ms": statistics.median(idle) * 1e3,
            "prometheus_cpu_ms": prom * 1e3, "prometheus_bytes": len(text),
            "records_read": records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 64])
    ap.add_argument("--per-second", type=int, default=2000,
                    help="records a rank appends between two refreshes (default 2000)")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    print(f"{'ranks':>5} {'new rec/rank':>12} {'refresh CPU':>12} {'with split':>11} "
          f"{'of which snapshot':>17} {'idle refresh':>12} {'/metrics':>9}")
    for r in args.ranks:
        m = measure(r, args.repeat + 2, args.per_second, args.repeat)
        print(f"{r:>5} {m['records_per_rank_per_refresh']:>12.0f} "
              f"{m['refresh_cpu_ms']:>9.1f} ms {m['split_refresh_cpu_ms']:>8.1f} ms "
              f"{m['snapshot_cpu_ms']:>14.1f} ms "
              f"{m['idle_refresh_cpu_ms']:>9.1f} ms {m['prometheus_cpu_ms']:>6.1f} ms")


if __name__ == "__main__":
    main()
