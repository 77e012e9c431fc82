"""Load traces into one DataFrame (the row schema of docs/ARCHITECTURE.md section 3).

`load(*paths, label=None)` accepts, per path: a trace.json (its parquet
dataset is read; if the dataset is gone, the events in trace.json are used,
with a warning: fewer columns, and only the calls the trace kept), a profile
directory (its trace.json, else its ranks/*.parquet, else its raw files read
in memory), a parquet file, or a raw .hvprof file.  Several paths are
concatenated with a `label` column (default: the directory name of each).

Filters are pushed down to the parquet scan (rows never materialized):
`ranks`, `steps` (an inclusive (first, last) pair), `ops`.  A window written by
`profiler export` loads as its window: the dataset's rows with the export's
filters (every column), or, when the dataset is not reachable from it, the
window's own events.  For summaries of big traces without loading them, see
profiler.analysis.engine.summarize_dataset.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from profiler.errors import (
    EmptyProfileError,
    NotFoundError,
    UsageError,
)
from profiler.formats.filters import RowFilter
from profiler.formats.trace_dataset import Dataset, read_files
from profiler.layout import resolve_trace

__all__ = ["load", "load_aggregates", "load_meta", "resolve_trace", "RowFilter", "read_files",
           "window_for"]


def load_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The `horovod_profiler` metadata block of a trace (path or profile directory)."""
    from profiler.formats.tracejson import read_trace_meta

    return read_trace_meta(resolve_trace(path))



def trace_meta(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The trace metadata behind `path`, None for a parquet or raw file or a
    directory without trace.json."""
    p = Path(path)
    if p.suffix in (".parquet", ".hvprof") or (p.is_dir() and not (p / "trace.json").exists()):
        return None
    return load_meta(p)


def _load_trace(p: Path, flt: RowFilter | None,
                columns: Sequence[str] | None) -> pd.DataFrame:
    from profiler.formats.tracejson import events_to_frame, read_trace, read_trace_meta

    meta = read_trace_meta(p)
    window = RowFilter.of_window(meta.get("window"))
    both = (flt or RowFilter()).and_(window)
    ds = meta.get("dataset") or {}
    files = [p.parent / f for f in ds.get("files", [])]
    if files and all(f.is_file() for f in files):
        return read_files(files, both, columns)
    gone = [str(f) for f in files if not f.is_file()]
    _, events = read_trace(p)
    ev = meta.get("events") or {}
    if window is None:
        warnings.warn(
            f"{p}: parquet dataset missing ({', '.join(gone[:2]) or 'none named'}); using "
            f"the {ev.get('included', '?')} events in trace.json (of {ev.get('total', '?')} "
            "calls)", stacklevel=3)
    df = (flt or RowFilter()).apply(events_to_frame(events))
    if columns is not None:
        df = df[[c for c in columns if c in df.columns]]
    return df


def _load_dir(p: Path, flt: RowFilter | None,
              columns: Sequence[str] | None) -> pd.DataFrame:
    from profiler.formats.raw import read_raw
    from profiler.formats.rows import raw_to_frame
    from profiler.layout import rank_files
    from profiler.postjob.classify import classify

    if (p / "trace.json").is_file():
        return _load_trace(p / "trace.json", flt, columns)
    parquets = rank_files(p, "ranks", "parquet")
    if parquets:
        return read_files([f for _, f in sorted(parquets.items())], flt, columns)
    raws = rank_files(p, "raw", "hvprof")
    if raws:
        want = None if flt is None or flt.ranks is None else set(flt.ranks)
        frames = [raw_to_frame(read_raw(f), classify) for r, f in sorted(raws.items())
                  if want is None or r in want]
        df = (flt or RowFilter()).apply(_concat(frames))
        return df if columns is None else df[[c for c in columns if c in df.columns]]
    raise EmptyProfileError(p, "not a profile directory: no trace.json, ranks/ or raw/ files")


def _load_one(path: str | os.PathLike[str], flt: RowFilter | None,
              columns: Sequence[str] | None) -> pd.DataFrame:
    from profiler.formats.raw import read_raw
    from profiler.formats.rows import raw_to_frame
    from profiler.postjob.classify import classify

    p = Path(path)
    if not p.exists():
        raise NotFoundError(p, "no such file or directory")
    if p.is_dir():
        return _load_dir(p, flt, columns)
    if p.suffix == ".parquet":
        return read_files([p], flt, columns)
    if p.suffix == ".hvprof":
        df = (flt or RowFilter()).apply(raw_to_frame(read_raw(p), classify))
        return df if columns is None else df[[c for c in columns if c in df.columns]]
    return _load_trace(p, flt, columns)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    from profiler.formats.rows import empty_frame
    from profiler.formats.schema import CATEGORY_COLUMNS

    if not frames:
        return empty_frame()
    if len(frames) == 1:
        return frames[0]
    df = pd.concat(frames, ignore_index=True)
    for c in (*CATEGORY_COLUMNS, "label"):
        if c in df.columns and not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype("category")
    return df


def window_for(path: str | os.PathLike[str], max_rows: int, *, first_ranks: int = 16
               ) -> tuple[RowFilter, dict[str, Any]] | None:
    """A bounded window of a dataset with more than `max_rows` rows: the first
    `first_ranks` ranks plus the stragglers, over the consecutive middle steps that
    fit (the policy of trace.json's event selection, profiler.postjob.window.select_events,
    without its step cap).  The stragglers come from one pass over every rank's
    collectives, in place (engine.stragglers_dataset, imbalance.window_stragglers),
    so that a late rank of a thousand is in the window; without one, the least
    communication time of the rank metadata.  None when everything fits, or when the
    path has no parquet dataset.  Returns the filter and {"description", "rows",
    "rows_total", "ranks", "steps", "t_start_ns", "stragglers", "job_steps"}
    ("stragglers": the pass's ranking, worst first, at most 16 rows; "job_steps":
    the most steps a rank's metadata counts, 0 when none does)."""
    import orjson

    from profiler.postjob.window import select_events

    from .engine import open_dataset

    ds = open_dataset(path)
    if ds is None or ds.window is not None:
        return None
    metas: list[dict[str, Any]] = []
    for f in ds.files:
        js = f.with_suffix(".json")
        try:
            metas.append(orjson.loads(js.read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            metas = []
            break
    ranking, prefer = _whole_job_stragglers(ds)
    sel = select_events(ds.files, metas, max_rows, first_ranks=first_ranks,
                        max_steps=1 << 40, prefer_ranks=prefer)
    if sel.ranks is None or sel.t_window_ns is None:
        return None
    flt = RowFilter.of(ranks=sel.ranks, t_start_ns=sel.t_window_ns)
    return flt, {"description": sel.description, "rows": sel.included,
                 "rows_total": sel.total, "ranks": sel.ranks,
                 "steps": list(sel.steps) if sel.steps else None,
                 "t_start_ns": list(sel.t_window_ns),
                 "stragglers": ranking,
                 "job_steps": max((int((m.get("steps") or {}).get("steps") or 0)
                                   for m in metas), default=0)}


def _whole_job_stragglers(ds: Dataset) -> tuple[list[dict[str, Any]], list[int]]:
    """The straggler ranking over every data collective of the dataset (all kinds
    when it has no kind column) and the outlying ranks a window must hold."""
    from .engine import stragglers_dataset
    from .imbalance import window_stragglers

    ranking = stragglers_dataset(ds, kinds=["data"] if "kind" in ds.columns else None)
    rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
            for r in ranking.head(16).to_dict("records")]
    return rows, window_stragglers(ranking)


def default_label(path: str | os.PathLike[str]) -> str:
    """A profile's name when the user gives none: its directory's."""
    p = Path(path).resolve()
    if p.is_dir():
        return p.name
    if p.name == "trace.json" or p.parent.name in ("ranks", "raw"):
        return (p.parent.parent if p.parent.name in ("ranks", "raw") else p.parent).name
    return p.stem


def _default_labels(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Each path's default_label, a repeated one numbered (run, run#2, run#3)."""
    labels: list[str] = []
    for p in paths:
        base = default_label(p)
        name, i = base, 2
        while name in labels:
            name, i = f"{base}#{i}", i + 1
        labels.append(name)
    return labels


def load(*paths: str | os.PathLike[str], label: str | Sequence[str] | None = None,
         ranks: Iterable[int] | None = None,
         columns: Sequence[str] | None = None,
         steps: Sequence[int] | None = None,
         ops: Iterable[str] | None = None,
         max_rows: int | None = None) -> pd.DataFrame:
    """Load one or more traces (see module doc) into one DataFrame.

    label: a label per path (a string for a single path); with several paths
    and no label, each path's directory name.  ranks: keep only these ranks;
    steps: (first, last) step numbers, inclusive; ops: keep only these ops (all
    pushed down to the parquet scan).  columns: read only these columns.
    max_rows: a trace whose dataset holds more rows (per path: max_rows divided
    by the number of paths) is loaded as a window of it (window_for: the first
    ranks, the likely stragglers, the middle steps); ``df.attrs["selection"]``
    then says which, per label ("" for a single trace).  Tables over every call
    of such a trace: profiler.analysis.engine.
    """
    if not paths:
        raise UsageError(None, "load() needs at least one path")
    flt: RowFilter | None = RowFilter.of(ranks=ranks, steps=steps, ops=ops)
    if flt is not None and flt.empty():
        flt = None
    if label is None:
        labels: list[str] | None = _default_labels(paths) if len(paths) > 1 else None
    else:
        labels = [label] if isinstance(label, str) else [str(x) for x in label]
        if len(labels) != len(paths):
            raise UsageError(None, f"{len(labels)} label(s) for {len(paths)} path(s)")
    frames = []
    selections: dict[str, dict[str, Any]] = {}
    for i, p in enumerate(paths):
        flt_p = flt
        if max_rows is not None:
            w = window_for(p, max(1, int(max_rows) // len(paths)))
            if w is not None:
                flt_p = (flt or RowFilter()).and_(w[0])
                selections[labels[i] if labels is not None else ""] = w[1]
        df = _load_one(p, flt_p, columns)
        if labels is not None:
            df = df.copy()
            df["label"] = pd.Categorical([labels[i]] * len(df), categories=labels)
        frames.append(df)
    out = _concat(frames)
    if selections:
        out.attrs["selection"] = selections
    return out


def _aggregate_files(path: str | os.PathLike[str]) -> list[Path]:
    p = Path(path)
    if not p.exists():
        raise NotFoundError(p, "no such file or directory")
    if p.is_file() and p.name.endswith(".agg.parquet"):
        return [p]
    if p.is_dir() and not (p / "trace.json").is_file():
        return sorted((p / "ranks").glob("rank-*.agg.parquet"))
    t = resolve_trace(p)
    meta = load_meta(t)
    return [t.parent / f for f in (meta.get("dataset") or {}).get("aggregates", [])]


def load_aggregates(*paths: str | os.PathLike[str], label: str | Sequence[str] | None = None,
                    ranks: Iterable[int] | None = None) -> pd.DataFrame:
    """Summary-mode aggregates (HOROVOD_PROFILE=summary) of one or more traces.

    One row per (rank, thread, op, communicator, size, dtype, redop) with calls,
    total/min/max ns and a latency histogram (profiler.formats.dataset.AGG_COLUMNS).
    Empty for a trace recorded call by call."""
    from profiler.formats.dataset import read_dataset
    from profiler.formats.schema import AGG_COLUMNS

    if not paths:
        raise UsageError(None, "load_aggregates() needs at least one path")
    labels = None
    if label is not None:
        labels = [label] if isinstance(label, str) else [str(x) for x in label]
        if len(labels) != len(paths):
            raise UsageError(None, f"{len(labels)} label(s) for {len(paths)} path(s)")
    elif len(paths) > 1:
        labels = _default_labels(paths)
    frames = []
    for i, p in enumerate(paths):
        files = _aggregate_files(p)
        if files:
            df = read_dataset(files, ranks=ranks, aggregates=True)
        else:
            df = pd.DataFrame({c: pd.Series(dtype="object") for c in AGG_COLUMNS})
        if labels is not None:
            df = df.copy()
            df["label"] = pd.Categorical([labels[i]] * len(df), categories=labels)
        frames.append(df)
    return frames[0] if len(frames) == 1 else _concat(frames)
