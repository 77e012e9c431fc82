"""A profile's rows as trace.json's events: the per-rank sources (a frame or
a parquet file), which rows can be events, and a Selection of them.  Pure
reading; which rows a bounded view shows is policy (profiler.postjob.window)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
import pandas as pd

from profiler.errors import CorruptError

Source = Union[pd.DataFrame, str, os.PathLike[str]]

#: Rows of the dataset that are never events of trace.json: per-thread CPU
#: samples (op "cpu", hooks/cpu.c).  Each spans a step on the track of the
#: thread it measures, so it crosses that thread's call and step events, and
#: a trace viewer needs a track's slices nested (Perfetto flags the rest).
#: They stay in the dataset; the trace's event counts leave them out.
NOT_EVENT_OPS = ("cpu",)


def event_mask(df: pd.DataFrame) -> np.ndarray:
    """Rows of df that can be trace.json events (not NOT_EVENT_OPS)."""
    if "op" not in df.columns or not len(df):
        return np.ones(len(df), dtype=bool)
    op = df["op"]
    if isinstance(op.dtype, pd.CategoricalDtype):
        hit = np.isin(np.asarray(op.cat.categories.astype(str)), NOT_EVENT_OPS)
        return ~np.append(hit, False)[op.cat.codes.to_numpy()]
    return ~op.astype(str).isin(NOT_EVENT_OPS).to_numpy()


def events_only(df: pd.DataFrame) -> pd.DataFrame:
    keep = event_mask(df)
    return df if keep.all() else df.iloc[np.flatnonzero(keep)]


def source_rank(src: Source, m: Mapping[str, Any] | None, i: int) -> int:
    if m is not None and "rank" in m:
        return int(m["rank"])
    if isinstance(src, pd.DataFrame):
        return int(src["rank"].iloc[0]) if len(src) and "rank" in src.columns else i
    name = Path(src).name
    try:
        return int(name.split("-", 1)[1].split(".", 1)[0])
    except (IndexError, ValueError):
        return i


def _cpu_rows(m: Mapping[str, Any] | None) -> int | None:
    """The rank metadata's count of CPU-sample rows (cpu.rows), None when it has none."""
    cpu = m.get("cpu") if m is not None else None
    n = cpu.get("rows") if isinstance(cpu, Mapping) else None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def source_rows(src: Source, m: Mapping[str, Any] | None, events: bool = False) -> int:
    """Rows of one rank: the frame's length, else the rank metadata's count, else the
    parquet footer (no row is read).  events: only the rows that can be events
    (NOT_EVENT_OPS left out: from the metadata's count, else from the op column)."""
    if isinstance(src, pd.DataFrame):
        return int(event_mask(src).sum()) if events else len(src)
    if m is not None and isinstance(m.get("rows"), int):
        if not events:
            return int(m["rows"])
        # metadata without the count was written before CPU samples existed
        return max(0, int(m["rows"]) - (_cpu_rows(m) or 0))
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(src).metadata
        if not events or "op" not in meta.schema.names:
            return int(meta.num_rows)
    except (OSError, ValueError) as exc:
        raise CorruptError(src, f"unreadable parquet footer: {exc}") from None
    return int(event_mask(read_source(src, ["op"])).sum())


def read_source(src: Source, columns: Sequence[str] | None = None,
                 t_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """A rank's rows (those starting in t_range = [lo, hi) when given: pushed down
    to the parquet scan), in file order."""
    if isinstance(src, pd.DataFrame):
        df = src if columns is None else src[[c for c in columns if c in src.columns]]
        if t_range is not None:
            t = df["t_start_ns"].to_numpy()
            df = df.iloc[np.flatnonzero((t >= t_range[0]) & (t < t_range[1]))]
        return df
    from profiler.formats.dataset import read_dataset

    if t_range is None:
        return read_dataset([src], columns=columns)
    import pyarrow.dataset as pads

    t = pads.field("t_start_ns")
    return read_dataset([src], columns=columns, filter=(t >= t_range[0]) & (t < t_range[1]))


@dataclass
class Selection:
    """Which rows of which sources go into trace.json, and how to say so."""

    picked: list[int]  # indices into the sources
    rows: dict[int, np.ndarray | None]  # source index -> row indices of what is read
    #                                    (None: all of it)
    included: int
    total: int
    description: str
    ranks: list[int] | None = None  # for a window
    steps: tuple[int, int] | None = None
    t_window_ns: tuple[int, int] | None = None
    reads: dict[int, tuple[int, int]] | None = None  # source -> [lo, hi) start times read

    def events_meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {"included": self.included, "total": self.total,
                               "selection": self.description}
        if self.ranks is not None:
            out["ranks"] = self.ranks
            out["steps"] = list(self.steps) if self.steps is not None else None
            out["t_window_ns"] = list(self.t_window_ns) if self.t_window_ns else None
        return out


def read_events(src: Source, t_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """A rank's rows that can be trace.json events (read_source without
    NOT_EVENT_OPS): what the indices of profiler.postjob.window.select_events(events=True) index."""
    return events_only(read_source(src, t_range=t_range))
