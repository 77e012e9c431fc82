"""Load traces into one DataFrame (the row schema of docs/ARCHITECTURE.md section 3).

`load(*paths, label=None)` accepts, per path: a trace.json (its parquet
dataset is read; if the dataset is gone, the events in trace.json are used,
with a warning: fewer columns, and only the calls the trace kept), a profile
directory (its trace.json, else its ranks/*.parquet, else its raw files read
in memory), a parquet file, or a raw .hvprof file.  Several paths are
concatenated with a `label` column (default: the directory name of each).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from profiler.errors import EmptyProfileError, NotATraceError, NotFoundError, UsageError

__all__ = ["load", "load_aggregates", "load_meta", "resolve_trace"]


def resolve_trace(path: str | os.PathLike[str]) -> Path:
    """A profile directory -> its trace.json; a file -> itself (must exist)."""
    p = Path(path)
    if not p.exists():
        raise NotFoundError(p, "no such file or directory")
    if p.is_dir():
        t = p / "trace.json"
        if t.is_file():
            return t
        raise NotATraceError(p, "directory without trace.json (run `profiler merge` on it)")
    return p


def load_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The `horovod_profiler` metadata block of a trace (path or profile directory)."""
    from profiler.tracejson import read_trace_meta

    return read_trace_meta(resolve_trace(path))


def _load_trace(p: Path, ranks: Iterable[int] | None,
                columns: Sequence[str] | None) -> pd.DataFrame:
    from profiler.dataset import read_dataset
    from profiler.tracejson import events_to_frame, read_trace, read_trace_meta

    meta = read_trace_meta(p)
    ds = meta.get("dataset") or {}
    files = [p.parent / f for f in ds.get("files", [])]
    if files and all(f.is_file() for f in files):
        return read_dataset(files, ranks=ranks, columns=columns)
    gone = [str(f) for f in files if not f.is_file()]
    _, events = read_trace(p)
    ev = meta.get("events") or {}
    warnings.warn(
        f"{p}: parquet dataset missing ({', '.join(gone[:2]) or 'none named'}); using the "
        f"{ev.get('included', '?')} events in trace.json (of {ev.get('total', '?')} calls)",
        stacklevel=3,
    )
    df = events_to_frame(events)
    if ranks is not None:
        df = df.loc[df["rank"].isin(list(ranks))].reset_index(drop=True)
    if columns is not None:
        df = df[[c for c in columns if c in df.columns]]
    return df


def _load_dir(p: Path, ranks: Iterable[int] | None,
              columns: Sequence[str] | None) -> pd.DataFrame:
    from profiler.dataset import raw_to_frame, read_dataset
    from profiler.merge import rank_files
    from profiler.raw import read_raw

    if (p / "trace.json").is_file():
        return _load_trace(p / "trace.json", ranks, columns)
    want = None if ranks is None else {int(r) for r in ranks}
    parquets = rank_files(p, "ranks", "parquet")
    if parquets:
        files = [f for r, f in sorted(parquets.items()) if want is None or r in want]
        return read_dataset(files, ranks=ranks, columns=columns)
    raws = rank_files(p, "raw", "hvprof")
    if raws:
        frames = [raw_to_frame(read_raw(f)) for r, f in sorted(raws.items())
                  if want is None or r in want]
        df = _concat(frames)
        return df if columns is None else df[[c for c in columns if c in df.columns]]
    raise EmptyProfileError(p, "not a profile directory: no trace.json, ranks/ or raw/ files")


def _load_one(path: str | os.PathLike[str], ranks: Iterable[int] | None,
              columns: Sequence[str] | None) -> pd.DataFrame:
    from profiler.dataset import raw_to_frame, read_dataset
    from profiler.raw import read_raw

    p = Path(path)
    if not p.exists():
        raise NotFoundError(p, "no such file or directory")
    if p.is_dir():
        return _load_dir(p, ranks, columns)
    if p.suffix == ".parquet":
        return read_dataset([p], ranks=ranks, columns=columns)
    if p.suffix == ".hvprof":
        df = raw_to_frame(read_raw(p))
        if ranks is not None:
            df = df.loc[df["rank"].isin(list(ranks))].reset_index(drop=True)
        return df if columns is None else df[[c for c in columns if c in df.columns]]
    return _load_trace(p, ranks, columns)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    from profiler.dataset import CATEGORY_COLUMNS, empty_frame

    if not frames:
        return empty_frame()
    if len(frames) == 1:
        return frames[0]
    df = pd.concat(frames, ignore_index=True)
    for c in (*CATEGORY_COLUMNS, "label"):
        if c in df.columns and not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype("category")
    return df


def _default_label(path: str | os.PathLike[str]) -> str:
    p = Path(path).resolve()
    if p.is_dir():
        return p.name
    if p.name == "trace.json" or p.parent.name in ("ranks", "raw"):
        return (p.parent.parent if p.parent.name in ("ranks", "raw") else p.parent).name
    return p.stem


def load(*paths: str | os.PathLike[str], label: str | Sequence[str] | None = None,
         ranks: Iterable[int] | None = None,
         columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Load one or more traces (see module doc) into one DataFrame.

    label: a label per path (a string for a single path); with several paths
    and no label, each path's directory name.  ranks: keep only these ranks
    (pushed down to the parquet scan).  columns: read only these columns.
    """
    if not paths:
        raise UsageError(None, "load() needs at least one path")
    rank_list = None if ranks is None else [int(r) for r in ranks]
    if label is None:
        labels: list[str] | None = None
        if len(paths) > 1:
            labels = []
            for p in paths:
                base = _default_label(p)
                name, i = base, 2
                while name in labels:
                    name, i = f"{base}#{i}", i + 1
                labels.append(name)
    else:
        labels = [label] if isinstance(label, str) else [str(x) for x in label]
        if len(labels) != len(paths):
            raise UsageError(None, f"{len(labels)} label(s) for {len(paths)} path(s)")
    frames = []
    for i, p in enumerate(paths):
        df = _load_one(p, rank_list, columns)
        if labels is not None:
            df = df.copy()
            df["label"] = pd.Categorical([labels[i]] * len(df), categories=labels)
        frames.append(df)
    return _concat(frames)


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
    total/min/max ns and a latency histogram (profiler.dataset.AGG_COLUMNS).
    Empty for a trace recorded call by call."""
    from profiler.dataset import AGG_COLUMNS, read_dataset

    if not paths:
        raise UsageError(None, "load_aggregates() needs at least one path")
    labels = None
    if label is not None:
        labels = [label] if isinstance(label, str) else [str(x) for x in label]
        if len(labels) != len(paths):
            raise UsageError(None, f"{len(labels)} label(s) for {len(paths)} path(s)")
    elif len(paths) > 1:
        labels = [_default_label(p) for p in paths]
    frames = []
    for i, p in enumerate(paths):
        files = _aggregate_files(p)
        if files:
            df = read_dataset(files, ranks=ranks)
        else:
            df = pd.DataFrame({c: pd.Series(dtype="object") for c in AGG_COLUMNS})
        if labels is not None:
            df = df.copy()
            df["label"] = pd.Categorical([labels[i]] * len(df), categories=labels)
        frames.append(df)
    return frames[0] if len(frames) == 1 else _concat(frames)
