"""Cluster scale (issue 7): 1024 ranks x 100k calls, summarize / report / finalize.

Generates (or reuses, --dir) a dataset with `profiler synth` from the real 2-rank
trace tests/data/analysis/fused, then measures, each in a fresh process (wall
time, peak RSS = the child's ru_maxrss):

  synth       `profiler synth` 1024 x 100k calls: time, parquet bytes per call
  summarize   `profiler summarize DIR` (table, DuckDB over the dataset)
  summ-json   `profiler summarize DIR --format json --by rank,op` (many groups)
  stragglers  profiler.analysis.stragglers_dataset(DIR) (cross-rank matching of
              every collective)
  advise      `profiler advise DIR --format json` (the findings over the bounded
              window advise loads: findings.MAX_ROWS rows)
  report      the report as profiler.analysis.report would build it for a big
              trace: load(DIR, columns=REPORT_COLUMNS, max_rows=5M) -> render_report,
              plus the exact summary table and straggler ranking from the engine
              (report.py itself loads every row: see the issue notes)
  finalize    rank 0's merge at exit (profiler.postjob.merge.merge: metadata of every rank,
              events of the ranks trace.json shows) at 2, 64 and 1024 ranks with the
              same calls per rank, and the conversion every rank does of its own raw
              file (profiler.formats.dataset.convert_raw of a 100k-call raw file)

Targets: summarize, advise and report < 60 s and < 4 GB at 1024 x 100k; finalize per rank
independent of the number of ranks.  Not a test: run it alone, late; the machine
is shared (the load average is printed with every figure).

    .venv/bin/python benchmarks/scale_job.py [--dir /tmp/scale1024] [--ranks 1024]
        [--calls 100000] [--skip synth,report,...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "data" / "analysis" / "fused" / "trace.json"
PY = sys.executable


def run(cmd: list[str], label: str, env: dict[str, str] | None = None) -> dict[str, float]:
    """Run a child; wall time and its peak RSS (from wait4)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=tempfile.gettempdir())
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        out.seek(0)
        text = out.read().decode(errors="replace")
        if p.returncode != 0:
            raise SystemExit(f"{label} failed ({p.returncode}):\n{err.read().decode()[-3000:]}")
    rss_gb = ru.ru_maxrss / 1024 / 1024
    print(f"{label:<38} {wall:8.2f} s   peak RSS {rss_gb:6.2f} GB   (load avg {load:.1f})",
          flush=True)
    return {"wall": wall, "rss_gb": rss_gb, "load": load, "stdout": text}  # type: ignore[dict-item]


def synth(d: Path, ranks: int, calls: int, seed: int = 7) -> dict[str, float]:
    r = run([PY, "-P", "-m", "profiler.cli", "synth", str(SOURCE), "-o", str(d), "--ranks",
             str(ranks), "--calls-per-rank", str(calls), "--stragglers",
             str(min(4, ranks - 1)), "--seed",
             str(seed), "--force", "-q"], f"synth {ranks} x {calls}")
    print("   ", str(r["stdout"]).strip())
    return r


REPORT = """
import sys, time
from profiler.analysis import load, stragglers_dataset, summarize_dataset, load_meta
from profiler.analysis.report import REPORT_COLUMNS, render_report
d = sys.argv[1]
t = time.perf_counter()
df = load(d, columns=REPORT_COLUMNS, max_rows=5_000_000)
sel = df.attrs.get("selection", {}).get("", {})
t_load = time.perf_counter() - t
summary = summarize_dataset(d, by=["op", "bucket"])
ranking = stragglers_dataset(d)
t_engine = time.perf_counter() - t - t_load
html = render_report(df, metas={"": load_meta(d)}, paths={"": d}, progress=False)
out = d.rstrip("/") + "-report.html"
open(out, "w").write(html + summary.to_html() + ranking.head(20).to_html())
print(f"rows loaded {len(df)} of {sel.get('rows_total')}; load {t_load:.1f} s, "
      f"engine tables {t_engine:.1f} s, render {time.perf_counter() - t - t_load - t_engine:.1f} s"
      f", top stragglers {ranking['rank'].head(4).tolist()}, {len(html) / 1e6:.1f} MB")
"""

FINALIZE = """
import sys, time
from profiler.postjob.merge import merge
d = sys.argv[1]
t = time.perf_counter()
res = merge(d, out=d + "/bench-trace.json")
print(f"{time.perf_counter() - t:.3f} {res.calls}")
"""

CONVERT = """
import sys, time
sys.path.insert(0, sys.argv[2])
import numpy as np, rawgen
from profiler.formats import record as F
from profiler.postjob.convert import convert_raw
d = sys.argv[1]
n = 100_000
w = rawgen.RawWriter(rank=1, world_size=2, chunk_bytes=F.DEFAULT_CHUNK_BYTES, clock_kind=1,
                     ticks_per_ns=2.6, cal0=(1000, 0), cal1=(1000 + 26_000_000_000, 10**10))
w.add_comm(0xC0FFEE, 2, 1, "MPI_COMM_WORLD")
hvd = w.add_track(2001, name="python", caller="mpi_lib.cpython-311-x86_64.so")
rng = np.random.default_rng(0)
dur = rng.integers(1000, 200000, n).astype(np.uint64)
start = np.cumsum(dur + 500)
w.add(hvd, rawgen.records(n, t_start=(1000 + start * 2.6).astype(np.uint64),
      t_end=(1000 + (start + dur) * 2.6).astype(np.uint64), bytes=rng.choice([8, 4096, 1 << 20], n),
      count=1, seq=np.arange(n), op=1, dtype=14, redop=1, dtype_size=4))
w.write(d + "/raw/rank-00001.hvprof")
t = time.perf_counter()
c = convert_raw(d + "/raw/rank-00001.hvprof", d)
print(f"{time.perf_counter() - t:.3f} {c.rows}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "hvprof-scale")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--skip", default="", help="comma-separated: synth,summarize,json,"
                                               "stragglers,advise,report,finalize")
    ap.add_argument("--keep", action="store_true", help="keep the generated datasets")
    args = ap.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    base = args.dir
    big = base / f"job{args.ranks}"
    base.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} cores, load avg {os.getloadavg()}", flush=True)
    if "synth" not in skip or not (big / "trace.json").is_file():
        synth(big, args.ranks, args.calls)
    files = list((big / "ranks").glob("rank-*.parquet"))
    nbytes = sum(f.stat().st_size for f in files)
    import orjson

    meta = orjson.loads((big / "trace.json").read_bytes()[len(b'{"horovod_profiler":'):].split(
        b',"displayTimeUnit"', 1)[0])
    calls, rows = meta["dataset"]["calls"], meta["dataset"]["rows"]
    print(f"dataset: {len(files)} files, {nbytes / 1e9:.2f} GB, {calls} calls, {rows} rows: "
          f"{nbytes / calls:.1f} bytes per call ({nbytes / rows:.1f} per row); trace.json "
          f"{(big / 'trace.json').stat().st_size / 1e6:.0f} MB with "
          f"{meta['events']['included']} events", flush=True)
    cli = [PY, "-P", "-m", "profiler.cli"]
    if "summarize" not in skip:
        run([*cli, "summarize", str(big)], "summarize (table)")
    if "json" not in skip:
        run([*cli, "summarize", str(big), "--format", "json", "--by", "rank,op"],
            "summarize --by rank,op (json)")
    if "stragglers" not in skip:
        r = run([PY, "-P", "-c", "import sys; from profiler.analysis import "
                 "stragglers_dataset as s; print(s(sys.argv[1]).head(4)['rank'].tolist())",
                 str(big)], "stragglers_dataset")
        print("    top 4:", str(r["stdout"]).strip(), "injected:",
              meta.get("synthetic", {}).get("stragglers"))
    if "advise" not in skip:
        r = run([*cli, "advise", str(big), "--format", "json"], "advise (json)")
        found = orjson.loads(str(r["stdout"]) or "{}").get("findings", [])
        print("    findings:", ", ".join(f["key"] for f in found))
    if "report" not in skip:
        r = run([PY, "-P", "-c", REPORT, str(big)], "report (bounded, see doc)")
        print("   ", str(r["stdout"]).strip())
    if "finalize" not in skip:
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            r = run([PY, "-P", "-c", CONVERT, tmp, str(ROOT / "tests")],
                    "convert_raw (every rank, 100k calls)")
            print("    in-process seconds, rows:", str(r["stdout"]).strip())
        for n in (2, 64):
            d = base / f"fin{n}"
            if not (d / "trace.json").is_file():
                synth(d, n, args.calls, seed=3)
        for d in (base / "fin2", base / "fin64", big):
            for i in range(3):
                r = run([PY, "-P", "-c", FINALIZE, str(d)], f"rank-0 merge {d.name} #{i + 1}")
                print("    in-process seconds, calls:", str(r["stdout"]).strip())
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
