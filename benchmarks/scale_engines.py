"""Engine choice for the scalable summary, by measurement (issue 7).

On a dataset made by `profiler synth` (default: the one benchmarks/scale_job.py
leaves with --keep, 1024 ranks x 100k calls), each engine computes the summary by
(op, power-of-two bucket) of the communication calls, in a fresh process (wall
time, peak RSS of that process):

  duckdb     profiler.analysis.engine.summarize_dataset: DuckDB over every parquet
             file, exact quantile_cont percentiles
  pyarrow    pyarrow.dataset scan (filters pushed down) + per-batch hash
             aggregation merged across batches: exact counts, sums and maxima,
             but no exact grouped percentiles (pyarrow has only a per-call
             t-digest, and digests of batches cannot be merged): percentiles
             would need every duration of a group in memory
  pandas     profiler.analysis.load + summarize (everything in memory) on the
             first --pandas-ranks ranks; memory per row extrapolated
  dask       profiler.analysis.distributed.summarize_dask on the first
             --dask-ranks ranks (LocalCluster, 2 in-process workers: the shuffle
             that puts each group in one partition for exact percentiles)

    .venv/bin/python benchmarks/scale_engines.py DIR [--pandas-ranks 64] [--dask-ranks 128]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable

DUCKDB = """
import sys, time
from profiler.analysis.engine import summarize_dataset
t = time.perf_counter()
s = summarize_dataset(sys.argv[1], by=["op", "bucket"])
print(f"{time.perf_counter() - t:.2f} s in process, {int(s['calls'].sum())} calls, {len(s)} groups")
"""

PYARROW = """
import sys, time, glob
import numpy as np, pyarrow as pa, pyarrow.compute as pc, pyarrow.dataset as ds
t = time.perf_counter()
files = sorted(glob.glob(sys.argv[1] + "/ranks/rank-*.parquet"))
d = ds.dataset(files, format="parquet")
flt = ((ds.field("backend") != "app") & ~ds.field("op").isin(["init", "finalize"])
       & ~ds.field("device"))
parts = []
for b in d.to_batches(columns=["op", "bytes", "dur_ns"], filter=flt, batch_size=1 << 20):
    tb = pa.Table.from_batches([b])
    nb = tb["bytes"].to_numpy()
    bucket = np.where(nb <= 0, 0, 1 << np.ceil(np.log2(np.maximum(nb, 1))).astype(np.int64))
    tb = tb.append_column("bucket", pa.array(bucket)).drop_columns(["bytes"])
    tb = tb.set_column(0, "op", pc.cast(tb["op"], pa.string()))
    parts.append(tb.group_by(["op", "bucket"]).aggregate([("dur_ns", "count"), ("dur_ns", "sum"),
                                                          ("dur_ns", "max")]))
agg = pa.concat_tables(parts).group_by(["op", "bucket"]).aggregate(
    [("dur_ns_count", "sum"), ("dur_ns_sum", "sum"), ("dur_ns_max", "max")])
print(f"{time.perf_counter() - t:.2f} s in process, {pc.sum(agg['dur_ns_count_sum'])} calls, "
      f"{agg.num_rows} groups (no percentiles)")
"""

PANDAS = """
import sys, time
from profiler.analysis import load, summarize
t = time.perf_counter()
cols = ["rank", "backend", "op", "bytes", "dur_ns", "comm_size", "kind", "device", "t_start_ns",
        "t_end_ns"]
df = load(sys.argv[1], columns=cols, ranks=range(int(sys.argv[2])))
s = summarize(df, by=["op", "bucket"])
print(f"{time.perf_counter() - t:.2f} s in process, {len(df)} rows, {int(s['calls'].sum())} calls")
"""

DASK = """
import sys, time, logging
from dask.distributed import Client, LocalCluster
from profiler.analysis.distributed import summarize_dask
logging.getLogger("distributed").setLevel(logging.ERROR)
cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                       dashboard_address=None)
with cluster, Client(cluster) as client:
    t = time.perf_counter()
    s = summarize_dask(sys.argv[1], by=["op", "bucket"], ranks=range(int(sys.argv[2])),
                       client=client)
    print(f"{time.perf_counter() - t:.2f} s in process, {int(s['calls'].sum())} calls")
"""


def run(code: str, args: list[str], label: str) -> None:
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([PY, "-P", "-c", code, *args], stdout=out, stderr=err,
                             cwd=tempfile.gettempdir())
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"{label}: failed\n{err.read().decode()[-2000:]}")
            return
        text = out.read().decode().strip()
    print(f"{label:<28} {wall:8.2f} s wall  peak RSS {ru.ru_maxrss / 2**20:6.2f} GB  "
          f"(load avg {load:.1f})  {text}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--pandas-ranks", type=int, default=64)
    ap.add_argument("--dask-ranks", type=int, default=128)
    ap.add_argument("--only", default="duckdb,pyarrow,pandas,dask")
    args = ap.parse_args()
    only = set(args.only.split(","))
    d = str(args.dataset)
    print(f"machine: {os.cpu_count()} cores, load avg {os.getloadavg()}")
    if "duckdb" in only:
        run(DUCKDB, [d], "duckdb (all ranks)")
    if "pyarrow" in only:
        run(PYARROW, [d], "pyarrow (all ranks)")
    if "pandas" in only:
        run(PANDAS, [d, str(args.pandas_ranks)], f"pandas ({args.pandas_ranks} ranks)")
    if "dask" in only:
        run(DASK, [d, str(args.dask_ranks)], f"dask ({args.dask_ranks} ranks)")


if __name__ == "__main__":
    main()
