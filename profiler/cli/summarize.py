"""`profiler summarize TRACE`: calls, sizes, latency and bandwidth per collective.

    profiler summarize trace.json [--by op,bucket] [--format table|csv|json] [--rank R]

TRACE is a trace.json, a profile directory or a parquet file.  The table shows
data traffic; when the trace classifies calls (kind column), Horovod's control
traffic gets its own line (calls, calls/s per rank, time share).  Sizes that
are not powers of two are marked with *.  A last line compares the slowest
and fastest rank's total communication time.  csv and json hold every
communication call (data and control), one row per group; json is a list of
objects with the grouping keys plus calls, total_bytes, total_us, mean_us,
p50_us, p95_us, p99_us, max_us, algbw_gbps, busbw_gbps, time_share, pow2.
A trace recorded with HOROVOD_PROFILE=summary is summarized from its
aggregates (percentiles then come from log-scale histograms).

Filters: --rank R (repeatable) or --ranks 0-7,12; --steps A-B; --ops a,b.  A
trace with a parquet dataset is queried in place (DuckDB over ranks/*.parquet,
filters pushed down, exact percentiles over every call, bounded memory: see
profiler.analysis.engine); --engine pandas loads it into memory instead, and
--engine dask runs the same query on Dask (--scheduler ADDRESS, else a local
cluster).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

DEFAULT_BY = "op,bucket"
# comm and seq: a device row (NCCL) times its host call through (rank, comm, seq, op)
_BASE_COLUMNS = ["rank", "backend", "op", "bytes", "dur_ns", "comm_size", "kind", "device",
                 "t_start_ns", "t_end_ns", "comm", "seq"]
_KEY_COLUMNS = {"thread": ["thread_kind"], "comm": ["comm", "comm_name"], "track": ["track"],
                "dtype": ["dtype"], "step": ["step"]}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "summarize", help="per-collective, per-size table of calls, latency and bandwidth",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="trace.json, profile directory or parquet file")
    p.add_argument("--by", action="append", metavar="KEYS",
                   help="grouping keys, comma-separated or repeated: op, bytes, bucket, "
                        f"rank, thread, comm, kind, track, dtype, backend, step "
                        f"(default {DEFAULT_BY})")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--rank", action="append", type=int, metavar="R",
                   help="only rank R (repeatable)")
    p.add_argument("--ranks", default=None, metavar="LIST", help="only these ranks, e.g. 0-7,12")
    p.add_argument("--steps", default=None, metavar="A-B", help="only these steps, e.g. 10-20")
    p.add_argument("--ops", default=None, metavar="LIST", help="only these ops, e.g. allreduce")
    p.add_argument("--engine", choices=("auto", "duckdb", "pandas", "dask"), default="auto",
                   help="auto: DuckDB over the parquet dataset when there is one, else pandas")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="--engine dask: the Dask scheduler (default: a local cluster)")
    return p


def _by_keys(values: list[str] | None) -> list[str]:
    raw = values or [DEFAULT_BY]
    return [k.strip() for v in raw for k in v.split(",") if k.strip()]


class Calls:
    """What the table needs, from per-call rows, summary-mode aggregates (in memory)
    or the parquet dataset queried in place (DatasetCalls)."""

    aggregated: bool
    has_kind: bool

    def ranks(self) -> list[int]:
        raise NotImplementedError

    def kinds(self) -> list[str]:
        raise NotImplementedError

    def count(self, kind: str | None = None) -> int:
        raise NotImplementedError

    def time_ns(self, kind: str | None = None) -> float:
        raise NotImplementedError

    def span_ns(self) -> float:
        raise NotImplementedError

    def per_rank_ns(self) -> Any:
        raise NotImplementedError

    def table(self, by: list[str], kinds: list[str] | None = None) -> Any:
        raise NotImplementedError

    def gpu_lines(self, meta: dict[str, Any] | None) -> list[str]:
        raise NotImplementedError


@dataclass
class FrameCalls(Calls):
    """Communication calls (rows or aggregates) in memory, rank-filtered."""

    frame: Any
    aggregated: bool
    summarize: Any  # (frame, by, kinds) -> DataFrame

    def __post_init__(self) -> None:
        self.has_kind = "kind" in self.frame.columns

    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.frame["rank"].unique())

    def kinds(self) -> list[str]:
        return ([str(k) for k in self.frame["kind"].unique()]
                if "kind" in self.frame.columns else [])

    def _sel(self, kind: str | None) -> Any:
        if kind is None:
            return self.frame
        return self.frame.loc[(self.frame["kind"] == kind).to_numpy(dtype=bool)]

    def time_ns(self, kind: str | None = None) -> float:
        col = "total_ns" if self.aggregated else "dur_ns"
        return float(self._sel(kind)[col].sum())

    def count(self, kind: str | None = None) -> int:
        f = self._sel(kind)
        return int(f["calls"].sum()) if self.aggregated else len(f)

    def span_ns(self) -> float:
        if self.aggregated or self.frame.empty:
            return 0.0
        return float(self.frame["t_end_ns"].max() - self.frame["t_start_ns"].min())

    def per_rank_ns(self) -> Any:
        col = "total_ns" if self.aggregated else "dur_ns"
        return self.frame.groupby("rank", observed=True)[col].sum()

    def table(self, by: list[str], kinds: list[str] | None = None) -> Any:
        return self.summarize(self.frame, by, kinds)

    def gpu_lines(self, meta: dict[str, Any] | None) -> list[str]:
        from profiler import gpu

        return gpu.summary_lines(meta, self.frame)


@dataclass
class DatasetCalls(Calls):
    """The parquet dataset queried in place (DuckDB, or Dask for the table)."""

    dataset: Any
    flt: dict[str, Any]
    overview: Any
    engine: str = "duckdb"
    scheduler: str | None = None
    has_kind: bool = True
    aggregated: bool = False

    def ranks(self) -> list[int]:
        return self.overview.ranks()

    def kinds(self) -> list[str]:
        return self.overview.kinds()

    def count(self, kind: str | None = None) -> int:
        return self.overview.count(kind)

    def time_ns(self, kind: str | None = None) -> float:
        return self.overview.time_ns(kind)

    def span_ns(self) -> float:
        return self.overview.span_ns()

    def per_rank_ns(self) -> Any:
        return self.overview.per_rank_ns()

    def table(self, by: list[str], kinds: list[str] | None = None) -> Any:
        flt = dict(self.flt)
        if kinds is not None:
            flt["kinds"] = kinds
        if self.engine == "dask":
            return _dask_table(self.dataset, by, flt, self.scheduler)
        from profiler.analysis.engine import summarize_dataset

        return summarize_dataset(self.dataset, by, **flt)

    def gpu_lines(self, meta: dict[str, Any] | None) -> list[str]:
        from profiler import gpu

        out = gpu.gpu_warnings(meta, self.overview.nccl_calls())
        note = gpu.device_time_note(meta)
        if note:
            out.append(note)
        for host, gpus in gpu.job_gpus(meta).items():
            out += gpu.topology_lines(gpus, host)
        return out


def _dask_table(dataset: Any, by: list[str], flt: dict[str, Any],
                scheduler: str | None) -> Any:
    import logging

    from dask.distributed import Client, LocalCluster

    from profiler.analysis.distributed import summarize_dask

    logging.getLogger("distributed").setLevel(logging.ERROR)
    if scheduler:
        with Client(scheduler) as client:
            return summarize_dask(dataset, by, client=client, **flt)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        return summarize_dask(dataset, by, client=client, **flt)


def _check_ranks(path: str, wanted: list[int] | None, present: list[int]) -> None:
    from profiler.errors import UsageError

    if not wanted:
        return
    have = set(present)
    absent = [r for r in wanted if r not in have]
    if absent:
        raise UsageError(path, f"rank {absent[0]} is not in this trace (ranks: "
                               f"{_ranks_text(sorted(have))})")


def _gather(path: str, meta: dict[str, Any] | None, by: list[str],
            ranks_arg: list[int] | None, steps: tuple[int, int] | None = None,
            ops: list[str] | None = None) -> FrameCalls:
    import numpy as np

    from profiler.analysis import load, load_aggregates, summarize, summarize_aggregates
    from profiler.analysis.summary import comm_calls
    from profiler.errors import UsageError

    aggregated = bool(meta and (meta.get("dataset") or {}).get("aggregates"))
    fn: Any
    if aggregated:
        if steps is not None:
            raise UsageError(path, "--steps: summary-mode aggregates have no steps")
        df = load_aggregates(path)
        df = df.assign(device=False)
        if ops is not None:
            df = df.loc[df["op"].astype(str).isin(ops).to_numpy()]
        fn = summarize_aggregates
    else:
        columns = list(_BASE_COLUMNS)
        for k in by:
            columns += _KEY_COLUMNS.get(k, [])
        df = load(path, columns=list(dict.fromkeys(columns)), steps=steps, ops=ops)
        fn = summarize
    if ranks_arg:
        _check_ranks(path, ranks_arg, np.unique(df["rank"].to_numpy()).tolist())
    frame = comm_calls(df, rank=ranks_arg)
    return FrameCalls(frame=frame, aggregated=aggregated,
                      summarize=lambda f, b, kinds=None: fn(f, by=b, kinds=kinds))


def _gather_dataset(path: str, dataset: Any, ranks_arg: list[int] | None,
                    steps: tuple[int, int] | None, ops: list[str] | None, engine: str,
                    scheduler: str | None) -> DatasetCalls:
    from profiler.analysis.engine import overview

    if ranks_arg:
        present = dataset.ranks()
        if present is None:
            present = overview(dataset).ranks()
        _check_ranks(path, ranks_arg, present)
    flt: dict[str, Any] = {"ranks": ranks_arg or None, "steps": steps, "ops": ops}
    ov = overview(dataset, ranks=ranks_arg or None, steps=steps, ops=ops)
    return DatasetCalls(dataset=dataset, flt=flt, overview=ov,
                        engine="dask" if engine == "dask" else "duckdb", scheduler=scheduler,
                        has_kind="kind" in dataset.columns)


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.summary import BY_KEYS
    from profiler.cli.export import parse_names, parse_ranges, parse_span
    from profiler.errors import UsageError

    by = _by_keys(args.by)
    for k in by:
        if k not in BY_KEYS:
            raise UsageError(None, f"--by: unknown key {k!r} (choose from "
                                   f"{', '.join(BY_KEYS)})")
    if len(set(by)) != len(by):
        raise UsageError(None, f"--by lists a key twice: {', '.join(by)}")
    ranks = list(args.rank or [])
    if args.ranks:
        ranks += parse_ranges(args.ranks)
    ranks_arg = sorted(set(ranks)) if ranks else None
    steps = parse_span(args.steps) if args.steps else None
    ops = parse_names(args.ops) if args.ops else None
    meta = _meta(args.trace)
    dataset = None
    import importlib.util

    if args.engine == "auto" and importlib.util.find_spec("duckdb") is None:
        args.engine = "pandas"  # the optional scale dependency is not installed
    if args.engine != "pandas":
        from profiler.analysis.engine import open_dataset

        dataset = open_dataset(args.trace)
        if dataset is not None and dataset.aggregated:
            dataset = None
        if dataset is None and args.engine in ("duckdb", "dask"):
            raise UsageError(args.trace, f"--engine {args.engine}: no parquet dataset to "
                                         "query (raw files, events only, or summary mode)")
    calls: Calls
    if dataset is not None:
        calls = _gather_dataset(args.trace, dataset, ranks_arg, steps, ops, args.engine,
                                args.scheduler)
    else:
        calls = _gather(args.trace, meta, by, ranks_arg, steps, ops)
    if args.format == "json":
        import orjson

        rows = _printable(calls.table(by)).to_dict(orient="records")
        sys.stdout.buffer.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2
                                             | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        return 0
    if args.format == "csv":
        _printable(calls.table(by)).to_csv(sys.stdout, index=False)
        return 0
    _print_table(args.trace, meta, calls, by)
    return 0


def _clock_line(meta: dict[str, Any]) -> str | None:
    """How well the ranks' clocks line up, when they are not one clock: the offsets'
    error bounds (half the best round trip) and the drift between MPI_Init and
    MPI_Finalize.  None for one host (offset 0 exactly)."""
    ranks = [r for r in meta.get("ranks") or []
             if (r.get("offset_method") or 0) > 0 and r.get("rank") != 0]
    if not ranks:
        return None
    errs = [max(int(r.get("offset_err_ns") or 0), int(r.get("offset_end_err_ns") or 0))
            for r in ranks]
    drifts = [abs(float(r["clock_drift_ppm"])) for r in ranks
              if r.get("clock_drift_ppm") is not None]
    line = (f"clock offsets: {len(ranks)} rank(s) aligned to rank 0 within "
            f"{_fmt_us(max(errs) / 1e3)}")
    if drifts and max(drifts) > 0:
        line += f", drift up to {max(drifts):.2f} ppm (corrected linearly)"
    elif drifts:
        line += ", no drift beyond the bounds"
    return line


def _printable(df: Any) -> Any:
    """A copy of the table with its names escaped: the pandas path gets them escaped
    when read (dataset.table_to_frame), the DuckDB path straight from the files,
    which another tool may have written."""
    from profiler.dataset import printable_columns

    return printable_columns(df.copy())


def _meta(path: str) -> dict[str, Any] | None:
    from pathlib import Path

    from profiler.analysis import load_meta

    p = Path(path)
    if p.suffix in (".parquet", ".hvprof") or (p.is_dir() and not (p / "trace.json").exists()):
        return None
    return load_meta(p)


def _ranks_text(ranks: list[int]) -> str:
    from profiler.merge import _ranges

    return _ranges(ranks) or "none"


def _fmt_us(v: float) -> str:
    if v != v:  # NaN
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} s"
    if v >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.2f} us" if v < 100 else f"{v:.1f} us"


def _fmt_bw(v: float) -> str:
    return "-" if v != v else f"{v:.3f}" if v < 10 else f"{v:.1f}"


def _print_table(path: str, meta: dict[str, Any] | None, calls: Calls, by: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from profiler.analysis._frame import fmt_bytes
    from profiler.raw import printable

    # A pipe or a file gets the full table, not an 80-column squeeze.
    console = Console(highlight=False, soft_wrap=False,
                      width=None if sys.stdout.isatty() else 200)
    data_kinds = None
    has_control = False
    if calls.has_kind and "kind" not in by:
        kinds = calls.kinds()
        has_control = "control" in kinds
        if has_control:
            data_kinds = [k for k in kinds if k != "control"]
    table_df = _printable(calls.table(by, data_kinds))

    n_ranks = len(calls.ranks())
    world = (meta or {}).get("world_size", n_ranks)
    title = f"{path}: {n_ranks} rank(s)" + (f" of {world}" if world != n_ranks else "")
    if data_kinds is not None:
        title += " - data traffic"
    if calls.aggregated:
        title += " (summary mode)"
    t = Table(title=Text(printable(title)), title_justify="left")
    for k in by:
        t.add_column(k, justify="right" if k in ("bytes", "rank", "track", "step") else "left",
                     no_wrap=True)
    for name in ("calls", "bytes", "total", "mean", "p50", "p95", "p99", "max",
                 "algbw GB/s", "busbw GB/s", "share"):
        t.add_column("total bytes" if name == "bytes" and "bytes" in by else name,
                     justify="right", no_wrap=True)
    irregular = False
    for row in table_df.itertuples(index=False):
        r = row._asdict()
        cells = []
        for k in by:
            v = r[k]
            if k == "bytes":
                text = f"{int(v)}"
                if not r["pow2"] and int(v) > 0:
                    text += " *"
                    irregular = True
            elif k == "bucket":
                text = str(v) + (" *" if not r["pow2"] else "")
                irregular |= not r["pow2"]
            else:
                text = str(v)
            cells.append(text)
        cells += [f"{r['calls']}", fmt_bytes(r["total_bytes"]), _fmt_us(r["total_us"]),
                  _fmt_us(r["mean_us"]), _fmt_us(r["p50_us"]), _fmt_us(r["p95_us"]),
                  _fmt_us(r["p99_us"]), _fmt_us(r["max_us"]), _fmt_bw(r["algbw_gbps"]),
                  _fmt_bw(r["busbw_gbps"]), f"{100 * r['time_share']:.1f}%"]
        t.add_row(*(Text(c) for c in cells))  # names are text, never rich markup
    console.print(t)
    if irregular:
        console.print("* sizes that are not powers of two")
    if calls.aggregated:
        console.print("percentiles estimated from log-scale latency histograms "
                      "(summary mode)")

    total_ns = calls.time_ns()
    if has_control:
        n_ctrl = calls.count("control")
        ctrl_ns = calls.time_ns("control")
        share = ctrl_ns / total_ns if total_ns else 0.0
        rate = ""
        if not calls.aggregated:
            span_ns = calls.span_ns()
            if span_ns > 0:
                per_s = n_ctrl / (span_ns / 1e9) / max(1, n_ranks)
                rate = f" ({per_s:.1f} calls/s per rank)"
        console.print(f"control traffic: {n_ctrl} calls{rate}, {_fmt_us(ctrl_ns / 1e3)}, "
                      f"{100 * share:.1f}% of communication time")
    per = calls.per_rank_ns()
    if len(per) > 1 and float(per.max()) == float(per.min()):
        console.print(f"per-rank communication time: {_fmt_us(float(per.max()) / 1e3)} on "
                      f"each of {len(per)} ranks")
    elif len(per) > 1:
        slow, fast = int(per.idxmax()), int(per.idxmin())
        s_us, f_us = float(per.max()) / 1e3, float(per.min()) / 1e3
        ratio = f"{s_us / f_us:.2f}x" if f_us > 0 else "inf"
        console.print(f"per-rank communication time: slowest rank {slow} {_fmt_us(s_us)}, "
                      f"fastest rank {fast} {_fmt_us(f_us)} ({ratio})")
    elif len(per) == 1:
        console.print(f"communication time: {_fmt_us(float(per.iloc[0]) / 1e3)} on rank "
                      f"{int(per.index[0])}")
    if meta:
        if meta.get("missing_ranks"):
            console.print(f"missing ranks: {_ranks_text(meta['missing_ranks'])}")
        if meta.get("partial_ranks"):
            console.print(f"partial ranks (killed before the end): "
                          f"{_ranks_text(meta['partial_ranks'])}")
        dropped = {int(r.get("rank", -1)): int(r.get("dropped") or 0)
                   for r in meta.get("ranks") or [] if isinstance(r, dict)}
        lost = {r: n for r, n in dropped.items() if n > 0}
        if lost:
            console.print(f"dropped records: {sum(lost.values())} calls not recorded (ranks "
                          f"{_ranks_text(sorted(lost))}: the raw file could not grow); the "
                          "statistics above miss them")
        clock = _clock_line(meta)
        if clock:
            console.print(clock, markup=False)
        ev = meta.get("events") or {}
        if ev.get("selection", "all") != "all":
            console.print(f"note: trace.json holds {ev.get('included')} of "
                          f"{ev.get('total')} calls; this summary reads the full dataset")
    for line in calls.gpu_lines(meta):
        console.print(line, markup=False)
