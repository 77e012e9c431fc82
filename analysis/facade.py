"""One way into a profile: open a trace (or a profile directory, or a parquet
file) once, choose the engine once, and ask questions through it.

    from profiler.analysis import TraceAnalysis
    ta = TraceAnalysis.open("horovod-profile-.../trace.json")      # engine="auto"
    ta.summary(by=["op", "bucket"])          # DataFrame: summary.summarize's table
    ta.calls(ranks=[0, 1]).count("control")  # the communication calls, any engine

Engines (as HolisticTraceAnalysis's TraceAnalysis hides its loaders):

* "pandas": every row in memory (analysis.load); also raw files, traces
  whose dataset is gone, and summary-mode aggregates;
* "duckdb": the parquet dataset queried in place (analysis.engine: filters
  pushed down, exact percentiles in bounded memory);
* "dask": the same query on a Dask cluster (analysis.distributed);
* "auto": DuckDB when there is a dataset to query and DuckDB is installed,
  else pandas.

`Calls` is what a summary needs from any of them (ranks, kinds, counts,
times, per-rank totals, the grouped table, the GPU lines); the CLI, the report
and the notebooks go through this module.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from profiler.layout import format_ranges

from .load import trace_meta

# comm and seq: a device row (NCCL) times its host call through (rank, comm, seq, op)
_BASE_COLUMNS = ["rank", "backend", "op", "bytes", "dur_ns", "comm_size", "kind", "device",
                 "t_start_ns", "t_end_ns", "comm", "seq",
                 # present only where the data has them (NCCL's plugin path; timeline)
                 "net_send_bytes", "net_recv_bytes", "net_ns", "net_steps", "source"]


_KEY_COLUMNS = {"thread": ["thread_kind"], "comm": ["comm", "comm_name"], "track": ["track"],
                "dtype": ["dtype"], "step": ["step"]}


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
        from . import gpu

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
        from . import gpu
        from .engine import nccl_extras

        out = gpu.gpu_warnings(meta, self.overview.nccl_calls())
        extras = nccl_extras(self.dataset)
        tl = gpu.timeline_note(extras)
        if tl:
            out.append(tl)
        out += gpu.network_lines(extras)
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
                               f"{format_ranges(sorted(have)) or 'none'})")


def _gather(path: str, meta: dict[str, Any] | None, by: list[str],
            ranks_arg: list[int] | None, steps: tuple[int, int] | None = None,
            ops: list[str] | None = None) -> FrameCalls:
    import numpy as np
    from profiler.analysis.summary import comm_calls

    from profiler.errors import UsageError

    from .load import load, load_aggregates
    from .summary import summarize, summarize_aggregates

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



ENGINES = ("auto", "pandas", "duckdb", "dask")


@dataclass
class TraceAnalysis:
    """A profile opened once, with its engine chosen once (module doc)."""

    path: str
    meta: dict[str, Any] | None
    engine: str                  # "pandas", "duckdb" or "dask": what answers
    dataset: Any = None          # engine.Dataset for duckdb / dask
    scheduler: str | None = None  # Dask scheduler address (None: a local cluster)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, engine: str = "auto",
             scheduler: str | None = None) -> TraceAnalysis:
        """Open `path` (trace.json, profile directory, parquet or raw file).

        engine="duckdb" or "dask" on a profile with no parquet dataset to query
        (raw files only, events only, summary mode) is a UsageError."""
        import importlib.util

        from profiler.errors import UsageError

        if engine not in ENGINES:
            raise UsageError(None, f"engine {engine!r}: choose from {', '.join(ENGINES)}")
        p = os.fspath(path)
        meta = trace_meta(p)
        if engine == "auto" and importlib.util.find_spec("duckdb") is None:
            engine = "pandas"  # the optional scale dependency is not installed
        dataset = None
        if engine != "pandas":
            from .engine import open_dataset

            dataset = open_dataset(p)
            if dataset is not None and dataset.aggregated:
                dataset = None
            if dataset is None and engine in ("duckdb", "dask"):
                raise UsageError(p, f"--engine {engine}: no parquet dataset to query (raw "
                                    "files, events only, or summary mode)")
        chosen = "pandas" if dataset is None else ("dask" if engine == "dask" else "duckdb")
        return cls(path=p, meta=meta, engine=chosen, dataset=dataset, scheduler=scheduler)

    def calls(self, *, by: Sequence[str] = (), ranks: Sequence[int] | None = None,
              steps: tuple[int, int] | None = None,
              ops: Sequence[str] | None = None) -> Calls:
        """The communication calls, filtered; `by`: the grouping keys the table
        will be asked for (the pandas engine loads only the columns they need)."""
        ranks_l = sorted(set(int(r) for r in ranks)) if ranks else None
        ops_l = list(ops) if ops is not None else None
        if self.dataset is not None:
            return _gather_dataset(self.path, self.dataset, ranks_l, steps, ops_l,
                                   self.engine, self.scheduler)
        return _gather(self.path, self.meta, list(by), ranks_l, steps, ops_l)

    def summary(self, by: Sequence[str] | str = ("op", "bucket"), *,
                ranks: Sequence[int] | None = None, steps: tuple[int, int] | None = None,
                ops: Sequence[str] | None = None,
                kinds: Sequence[str] | None = None) -> pd.DataFrame:
        """summary.summarize's table (keys + METRICS + time_share + pow2)."""
        by_l = [by] if isinstance(by, str) else list(by)
        return self.calls(by=by_l, ranks=ranks, steps=steps, ops=ops).table(
            by_l, list(kinds) if kinds is not None else None)

    def advise(self, *, bench: str | os.PathLike[str] | None = None,
               replay: str | os.PathLike[str] | None = None,
               only: Sequence[str] | None = None) -> Any:
        """The findings of this profile, ranked (analysis.findings.advise: the
        step breakdown and every analyzer; `bench`, `replay` as there)."""
        from .findings import advise

        return advise(self.path, bench=bench, replay=replay, only=only)

    def p2p(self, *, ranks: Sequence[int] | None = None,
            steps: tuple[int, int] | None = None) -> pd.DataFrame:
        """MPI point-to-point messages matched across ranks (p2p.match_p2p's
        table: one row per message); empty for a trace with none, or one
        recorded in summary mode (aggregates carry no peers or tags)."""
        from profiler.formats.record import P2P_OPS

        from .load import load
        from .p2p import PAIR_COLUMNS, match_p2p

        empty = pd.DataFrame({c: [] for c in PAIR_COLUMNS})
        if self.meta and (self.meta.get("dataset") or {}).get("aggregates"):
            return empty
        df = load(self.path, columns=["rank", "op", "comm", "comm_rank", "root", "tag",
                                      "bytes", "flags", "t_start_ns", "t_end_ns"],
                  ranks=ranks, steps=steps, ops=sorted(P2P_OPS))
        if df.empty or "tag" not in df.columns:
            return empty
        return match_p2p(df)
