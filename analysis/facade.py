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

Every CLI command that reads a profile opens it here once and asks: summary,
advise, p2p, report, compare, check, lineage and tensors, fusion_whatif,
export; hang (TraceAnalysis.open_raw: a live or dead job's raw files).  The
commands read no file themselves (tests/test_facade_door.py): a failure is a
ProfilerError raised where its cause is known, or a bug.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from profiler.formats.buckets import STALE_S, STUCK_FACTOR, WINDOW_S
from profiler.layout import format_ranges

from .breakdown import LABELS as BREAKDOWN_LABELS
from .live import Watcher
from .load import default_label, trace_meta
from .predict import Target, parse_layout, parse_link
from .summary import BY_KEYS

__all__ = ["BREAKDOWN_LABELS", "BY_KEYS", "Calls", "Target", "TraceAnalysis", "Watcher",
           "default_label", "parse_layout", "parse_link"]

if TYPE_CHECKING:
    from .fusion_whatif import WhatIf
    from .hang import Diagnosis
    from .predict import Prediction

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

    def rank_imbalance(self) -> dict[str, Any] | None:
        """Slowest and fastest rank's communication time (summary.rank_imbalance)."""
        from .summary import rank_imbalance

        return rank_imbalance(self.per_rank_ns())

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
            ops: list[str] | None = None, loaded: pd.DataFrame | None = None) -> FrameCalls:
    """loaded: the profile's rows already in memory (TraceAnalysis.rows), when
    they hold every row these filters ask for."""
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
        df = (loaded if loaded is not None else
              load(path, columns=list(dict.fromkeys(columns)), steps=steps, ops=ops))
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
    # answers computed once per profile (the lineage: tensors and the what-if share it)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

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

    def rows(self, max_rows: int | None = None) -> pd.DataFrame:
        """The profile's rows, loaded once and kept (analysis.load): every column
        the findings, the summary and the report read; above `max_rows` calls
        (default: the findings' MAX_ROWS) a bounded window of the job, which
        ``df.attrs["selection"]`` describes.  What advise, summary and report
        answer from, so that opening a profile reads its files once."""
        from .findings import COLUMNS, MAX_ROWS
        from .load import load
        from .report import REPORT_COLUMNS

        limit = MAX_ROWS if max_rows is None else max_rows
        key = f"rows:{limit}"
        if key not in self._cache:
            cols = list(dict.fromkeys([*COLUMNS, *REPORT_COLUMNS, *_BASE_COLUMNS,
                                       *(c for v in _KEY_COLUMNS.values() for c in v)]))
            self._cache[key] = load(self.path, columns=cols, max_rows=limit)
        return self._cache[key]

    def _whole_rows(self) -> pd.DataFrame | None:
        """rows() when it holds the whole profile (not a window), else None."""
        if self.dataset is not None or self._aggregated:
            return None
        df = self.rows()
        return None if df.attrs.get("selection") else df

    @property
    def _aggregated(self) -> bool:
        return bool(self.meta and (self.meta.get("dataset") or {}).get("aggregates"))

    def calls(self, *, by: Sequence[str] = (), ranks: Sequence[int] | None = None,
              steps: tuple[int, int] | None = None,
              ops: Sequence[str] | None = None) -> Calls:
        """The communication calls, filtered; `by`: the grouping keys the table
        will be asked for (the pandas engine answers from rows(), or, filtered
        by steps or ops, loads only the columns they need)."""
        ranks_l = sorted(set(int(r) for r in ranks)) if ranks else None
        ops_l = list(ops) if ops is not None else None
        if self.dataset is not None:
            return _gather_dataset(self.path, self.dataset, ranks_l, steps, ops_l,
                                   self.engine, self.scheduler)
        loaded = self._whole_rows() if steps is None and ops_l is None else None
        return _gather(self.path, self.meta, list(by), ranks_l, steps, ops_l, loaded=loaded)

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
        """The findings of this profile, ranked (analysis.findings.advise_frame
        on rows(), the rows loaded once: the step breakdown and every
        analyzer; `bench`, `replay`: other profiles, as analysis.findings.advise
        takes them)."""
        from .findings import advise_frame, context_of

        return advise_frame(self.rows(), self.meta, path=self.path, only=only,
                            bench=context_of(bench), replay=context_of(replay))

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

    def p2p_summary(self) -> dict[str, Any]:
        """Matched and unmatched messages, bytes, transfer p50 (p2p.p2p_summary)."""
        from .p2p import p2p_summary

        return p2p_summary(self.p2p())

    def notes(self) -> list[str]:
        """The trace metadata's one-line notes that every reader needs: the
        interconnect per host pair and the profiler's own cost (none for a
        profile without trace.json)."""
        from .interconnect import interconnect_line
        from .selfcost import cost_line

        if not self.meta:
            return []
        return [line for line in (interconnect_line(self.meta), cost_line(self.meta)) if line]

    @classmethod
    def open_raw(cls, directory: str | os.PathLike[str]) -> TraceAnalysis:
        """A profile directory read from its raw files alone (a live job's, one
        killed by a scheduler or by SIGKILL): nothing merged is needed, nothing
        is read until asked (hang)."""
        return cls(path=os.fspath(directory), meta=None, engine="pandas")

    def watch(self, *, window_s: float = WINDOW_S, stuck_factor: float = STUCK_FACTOR,
              stale_s: float = STALE_S) -> Watcher:
        """The live view of a running (or ended) job's raw files, refreshed
        incrementally (analysis.live.Watcher; `profiler watch`)."""
        return Watcher(self.path, window_s=window_s, stuck_factor=stuck_factor,
                       stale_s=stale_s)

    def hang(self) -> Diagnosis:
        """Who is stuck where, from every rank's raw file (analysis.hang.diagnose)."""
        from .hang import diagnose

        return diagnose(self.path)

    def check(self) -> Consistency:
        """Cross-rank consistency of a finished job (analysis.consistency)."""
        from .consistency import count_mismatches, mismatches
        from .load import load

        df = load(self.path, columns=_CHECK_COLUMNS)
        records = (int(((df["seq"] >= 0) & (df["backend"] != "app")).sum())
                   if len(df) else 0)
        return Consistency(mismatches=mismatches(df), call_counts=count_mismatches(df),
                           records=records,
                           ranks=int(df["rank"].nunique()) if len(df) else 0)

    def compare(self, *others: TraceAnalysis, labels: Sequence[str] | None = None,
                baseline: str | None = None, warmup: int = 1,
                ranks: Sequence[int] | None = None, steps: tuple[int, int] | None = None,
                max_rows: int | None = None, runs: Mapping[str, Sequence[str]] | None = None,
                paired: bool = False) -> Comparison:
        """This profile and `others` against the baseline (the first unless
        `baseline` names a label): analysis.compare.compare.  max_rows: rows
        loaded at most, all profiles together; a larger one is compared on a
        window of it (Comparison.windows says which).  runs, paired: the
        profiles' labels grouped into sides of repeated runs (compare.compare)."""
        from .compare import compare
        from .load import load

        df = load(self.path, *(o.path for o in others),
                  label=list(labels) if labels is not None else None,
                  columns=_COMPARE_COLUMNS, ranks=ranks, steps=steps, max_rows=max_rows)
        from profiler.formats.horovod_env import settings as horovod_settings

        names = (list(df["label"].cat.categories) if "label" in df.columns
                 and isinstance(df["label"].dtype, pd.CategoricalDtype) else [])
        cycles = {name: horovod_settings((ta.meta or {}).get("env") or {}).cycle_time_ms
                  for name, ta in zip(names, (self, *others))}
        return Comparison(table=compare(df, baseline=baseline, warmup=warmup, cycles=cycles,
                                        runs=runs, paired=paired),
                          windows=dict(df.attrs.get("selection") or {}))

    def report(self, out: str | os.PathLike[str], *others: TraceAnalysis,
               labels: Sequence[str] | None = None, title: str | None = None,
               progress: bool = True, max_rows: int | None = 5_000_000) -> Path:
        """The standalone HTML report of this profile (and `others`), written to
        `out` (analysis.report.write_profiles)."""
        from .report import write_profiles

        # one profile: the rows loaded once, when they are all of it and the
        # report would load no more
        frame = self._whole_rows() if not others and labels is None else None
        if frame is not None and max_rows is not None and len(frame) > max_rows:
            frame = None  # the report's own, smaller window
        return write_profiles([(ta.path, ta.meta, ta.dataset) for ta in (self, *others)], out,
                              labels=labels, title=title, progress=progress,
                              max_rows=max_rows, frame=frame)

    def _profile_dir(self) -> Path:
        p = Path(self.path)
        return p if p.is_dir() else p.parent

    def lineage(self) -> pd.DataFrame:
        """The fusion lineage: the lineage.parquet the merge wrote next to the
        trace (read once).  Building it is the post-job stage's
        (profiler.postjob.lineage, run by `profiler merge` and the merge at
        exit), not the analysis's: a NotFoundError saying why there is none,
        and that `profiler merge` builds it."""
        if "lineage" in self._cache:
            return self._cache["lineage"]
        from profiler import layout
        from profiler.errors import NotFoundError
        from profiler.formats import lineage as stored

        p = Path(self.path)
        if not p.exists():
            raise NotFoundError(p, "no such file or directory")
        d = self._profile_dir()
        info = (self.meta or {}).get("lineage")
        name = info.get("file") if isinstance(info, dict) else None
        candidates = [d / name] if isinstance(name, str) and "/" not in name else []
        candidates.append(d / layout.LINEAGE_FILE)
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            reason = (info.get("reason") if isinstance(info, dict) and info.get("reason")
                      else f"no {layout.LINEAGE_FILE} in {d}")
            raise NotFoundError(p, f"no fusion lineage: {reason} (`profiler merge {d}` "
                                   "builds it from the ranks' datasets)")
        table = stored.load(found)
        self._cache["lineage"] = table
        return table

    def use_lineage(self, table: pd.DataFrame) -> None:
        """Take the lineage a command built with the post-job stage
        (profiler.postjob.lineage.build_lineage) where the merge wrote none:
        lineage(), tensors() and fusion_whatif() use it."""
        self._cache["lineage"] = table

    def predict(self, target: Target, *, fabric: TraceAnalysis | None = None) -> Prediction:
        """The profiled job at `target`'s scale, link or setting (analysis.predict);
        `fabric`: a `profiler bench` result whose allreduce curve prices the
        transfers (for this profile's library).  The profile is read once and kept."""
        from dataclasses import replace

        from . import predict as P
        from .load import load

        prof = self._cache.get("predict_profile")
        if prof is None:
            prof = P.open_profile(self.path, lineage=P.find_lineage(self.path))
            self._cache["predict_profile"] = prof
        if fabric is not None:
            curve = P.fabric_curve(load(fabric.path), fabric.meta, prof.library)
            target = replace(target, fabric=curve)
        return P.predict(prof, target)

    def tensors(self) -> pd.DataFrame:
        """One row per (tensor, Horovod operation) of the lineage
        (analysis.lineage.per_tensor)."""
        from .lineage import per_tensor

        return per_tensor(self.lineage())

    def fusion_whatif(self) -> WhatIf | None:
        """Data calls and transfer time per step at other fusion thresholds and
        cycle times, predicted from this run (analysis.fusion_whatif.whatif);
        None when the run has too little to fit.  Reads the lineage and the
        ranks' datasets and metadata; a NotFoundError when those are missing."""
        from profiler.errors import NotFoundError, ProfilerError
        from profiler.formats.dataset import read_dataset, read_meta
        from profiler.layout import RANKS_DIR, meta_path, parquet_path, rank_files

        from .fusion_whatif import ranks_per_host, whatif

        lin = self.lineage()
        d = self._profile_dir()
        files = rank_files(d, RANKS_DIR, "parquet")
        if 0 not in files:
            raise NotFoundError(parquet_path(d, 0), "rank 0's dataset is needed")
        try:
            env = read_meta(meta_path(d, 0)).get("env") or {}
            rows = read_dataset([files[r] for r in sorted(files)], columns=_WHATIF_COLUMNS)
            metas = rank_files(d, RANKS_DIR, "json")
            hosts = [str(read_meta(f).get("host", "")) for f in metas.values()]
        except ProfilerError as exc:  # the readers' typed errors, said as what is missing
            raise NotFoundError(parquet_path(d, 0),
                                f"the ranks' datasets are needed: {exc.line()}") from None
        # Horovod rounds the threshold by the ranks per host: known when every rank's meta is read
        return whatif(lin, rows, env,
                      local_size=ranks_per_host(hosts) if len(hosts) == len(files) else None)

    def export(self, out: str | os.PathLike[str], *, ranks: list[int] | None = None,
               steps: tuple[int, int] | None = None, ops: list[str] | None = None,
               kinds: list[str] | None = None, t_start_ns: tuple[int, int] | None = None,
               limit: int = 0) -> dict[str, Any]:
        """Write a Perfetto-loadable trace.json of a window of this profile's
        parquet dataset (the filters pushed down; `limit`: refuse windows of
        more calls, 0: none); returns the window's metadata block."""
        from profiler.postjob.export import export_window

        return export_window(self.dataset if self.dataset is not None else self.path, out,
                             src=self.path, ranks=ranks, steps=steps, ops=ops, kinds=kinds,
                             t_start_ns=t_start_ns, limit=limit)


_CHECK_COLUMNS = ["rank", "backend", "op", "t_start_ns", "t_end_ns", "dur_ns", "bytes", "comm",
                  "comm_size", "seq", "dtype", "redop", "root", "device", "kind"]
_COMPARE_COLUMNS = ["rank", "backend", "op", "t_start_ns", "t_end_ns", "dur_ns", "bytes",
                    "count", "kind", "device", "comm", "seq", "step", "thread_kind", "flags",
                    "comm_size"]
# the row columns the fusion what-if reads (Horovod's allreduces, matched over ranks)
_WHATIF_COLUMNS = ["rank", "backend", "op", "t_start_ns", "t_end_ns", "dur_ns", "bytes", "comm",
                   "comm_size", "seq", "kind", "thread_kind", "track"]


@dataclass
class Consistency:
    """TraceAnalysis.check's answer: the mismatched call fields
    (consistency.mismatches), the ranks with missing calls
    (consistency.count_mismatches), and what was checked."""

    mismatches: pd.DataFrame
    call_counts: pd.DataFrame
    records: int   # calls with a sequence number, the application's own rows left out
    ranks: int

    @property
    def consistent(self) -> bool:
        return self.mismatches.empty and self.call_counts.empty


@dataclass
class Comparison:
    """TraceAnalysis.compare's answer: compare.compare's table, and per label
    the window compared when a trace was over max_rows (load's selection)."""

    table: pd.DataFrame
    windows: dict[str, dict[str, Any]]


