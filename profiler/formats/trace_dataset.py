"""The parquet dataset behind a trace: a trace.json's, a profile directory's
or one parquet file's per-rank files, with the trace's metadata and an
export's own window (its RowFilter), and the read of such files with a
filter pushed down to the scan.  What the post-job stage writes and every
engine of the analysis queries (analysis.engine, analysis.load, export)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profiler.errors import CorruptError, NotATraceError, NotFoundError
from profiler.formats.filters import RowFilter
from profiler.layout import file_rank

__all__ = ["Dataset", "open_dataset", "read_files"]


@dataclass
class Dataset:
    """A trace's per-rank parquet files (and its trace.json metadata, if any)."""

    path: Path
    files: list[Path]
    meta: dict[str, Any] | None = None
    window: RowFilter | None = None  # an export's own filters
    _columns: list[str] | None = field(default=None, repr=False)

    @property
    def columns(self) -> list[str]:
        if self._columns is None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            from profiler.formats.dataset import schema_columns

            try:
                self._columns = (schema_columns(pq.read_schema(self.files[0]))
                                 if self.files else [])
            except CorruptError as exc:
                raise CorruptError(self.files[0], exc.message) from None
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise CorruptError(self.files[0], f"unreadable parquet dataset: {exc}"
                                   ) from None
        return self._columns

    def ranks(self) -> list[int] | None:
        """The ranks of the files (from their names; None when a name does not say)."""
        out = [file_rank(f) for f in self.files]
        if any(r is None for r in out):
            return None
        ranks = sorted(int(r) for r in out if r is not None)
        if self.window is not None and self.window.ranks is not None:
            ranks = [r for r in ranks if r in set(self.window.ranks)]
        return ranks

    def filtered(self, flt: RowFilter | None) -> RowFilter | None:
        """`flt` and the dataset's own window; the files the filter can skip dropped
        by the caller through `files_for`."""
        if self.window is None:
            return flt
        return (flt or RowFilter()).and_(self.window)

    def files_for(self, flt: RowFilter | None) -> list[Path]:
        if flt is None or flt.ranks is None:
            return self.files
        want = set(flt.ranks)
        return [f for f in self.files if file_rank(f) is None or file_rank(f) in want]

    @property
    def aggregated(self) -> bool:
        return bool(((self.meta or {}).get("dataset") or {}).get("aggregates"))


def open_dataset(path: str | os.PathLike[str]) -> Dataset | None:
    """The parquet dataset behind a trace.json, a profile directory or a parquet file;
    None when there is none to query in place (a raw file, a directory with only raw
    files, a trace.json whose dataset is gone: load() handles those in memory)."""
    from profiler.formats.tracejson import read_trace_meta
    from profiler.layout import rank_files

    p = Path(path)
    if not p.exists():
        raise NotFoundError(p, "no such file or directory")
    if p.is_dir():
        if (p / "trace.json").is_file():
            return open_dataset(p / "trace.json")
        parquets = rank_files(p, "ranks", "parquet")
        if parquets:
            return Dataset(p, [f for _, f in sorted(parquets.items())])
        return None
    if not p.is_file():  # a FIFO or a device: refused before anything opens it
        raise NotATraceError(p, "not a regular file")
    if p.suffix == ".parquet":
        return Dataset(p, [p])
    if p.suffix == ".hvprof":
        return None
    meta = read_trace_meta(p)
    ds = meta.get("dataset") or {}
    files = [p.parent / f for f in ds.get("files", [])]
    if not files or not all(f.is_file() for f in files):
        return None
    return Dataset(p, files, meta, window=RowFilter.of_window(meta.get("window")))


def read_files(files: Sequence[Path], flt: RowFilter | None,
               columns: Sequence[str] | None) -> pd.DataFrame:
    """Parquet files of the row schema -> one DataFrame, the filter pushed down to the
    scan (files of other ranks are not even opened)."""
    from profiler.formats.dataset import read_dataset

    flt = flt or RowFilter()
    if flt.ranks is not None:
        want = set(flt.ranks)
        files = [f for f in files if file_rank(f) is None or file_rank(f) in want]
    expression = None if flt == RowFilter(ranks=flt.ranks) else flt.expression
    return read_dataset(files, ranks=flt.ranks, columns=columns, filter=expression)
