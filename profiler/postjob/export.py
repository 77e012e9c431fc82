"""`profiler export`: a window of a profile (ranks, steps, ops, kinds, start
times) written as its own trace.json, for Perfetto, beside the dataset it
points into.  A post-job stage, as the merge's trace.json is: the command
calls it directly, and TraceAnalysis.export hands it the dataset it opened."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from profiler.errors import CorruptError, NotATraceError, UsageError
from profiler.formats.dataset import read_meta
from profiler.formats.filters import RowFilter
from profiler.formats.trace_dataset import Dataset, open_dataset, read_files
from profiler.formats.tracejson import TRACE_FORMAT_VERSION, now_iso
from profiler.layout import file_rank, format_ranges
from profiler.postjob.window import write_trace

__all__ = ["export_window"]


def export_window(trace: str | os.PathLike[str] | Dataset, out: str | os.PathLike[str], *,
                  src: str | os.PathLike[str] | None = None,
                  ranks: list[int] | None = None, steps: tuple[int, int] | None = None,
                  ops: list[str] | None = None, kinds: list[str] | None = None,
                  t_start_ns: tuple[int, int] | None = None, limit: int = 0
                  ) -> dict[str, Any]:
    """Write a Perfetto-loadable trace.json of a window of a profile's parquet
    dataset (`trace`: a trace.json, a profile directory, a parquet file, or its
    Dataset opened already, then `src` names it), the filters pushed down;
    `limit`: refuse windows of more calls (0: none).  Returns the window's
    metadata block."""
    ds = trace if isinstance(trace, Dataset) else open_dataset(trace)
    where = Path(src if src is not None else trace.path if isinstance(trace, Dataset)
                 else trace)
    dest = Path(out)
    if dest.is_dir():
        raise UsageError(dest, "is a directory; give the window's file name")
    if ds is None:
        raise NotATraceError(where, "no parquet dataset to export from (raw files only, or "
                                    "the trace's dataset is gone; run `profiler merge` first)")
    if ds.aggregated:
        raise UsageError(where, "a summary-mode trace has aggregates, not calls: nothing to "
                                "export")
    asked = RowFilter.of(ranks=ranks, steps=steps, ops=ops, kinds=kinds, t_start_ns=t_start_ns)
    flt = ds.filtered(asked) or RowFilter()
    files = ds.files_for(flt)
    if ranks is not None:
        have = ds.ranks()
        if have is not None:
            absent = [r for r in ranks if r not in set(have)]
            if len(absent) == len(ranks):
                raise UsageError(where, f"none of the asked ranks is in this trace (ranks: "
                                      f"{format_ranges(have) or 'none'})")
    try:
        dataset = pads.dataset([str(f) for f in files], format="parquet")
        n = int(dataset.count_rows(filter=flt.expression(dataset.schema.names)))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptError(where, f"unreadable parquet dataset: {exc}") from None
    if limit and n > limit:
        raise UsageError(where, f"the window holds {n} calls, over the limit of {limit}: narrow "
                              "--ranks/--steps/--ops/--time-ms, or raise --limit (0: none)")
    frames = []
    metas: list[dict[str, Any]] = []
    for f in files:
        r = file_rank(f)
        part = read_files([f], flt, None)
        if not len(part):
            continue
        rank = int(part["rank"].iloc[0]) if r is None else r
        js = f.with_suffix(".json")
        # a rank's metadata (host, tracks) is optional; an unreadable one is an error
        m = read_meta(js) if js.is_file() else {"rank": rank, "host": "", "tracks": []}
        frames.append(part)
        metas.append(m)
    base = dest.resolve().parent
    meta = dict(ds.meta or {"format_version": TRACE_FORMAT_VERSION})
    ds_meta = dict(meta.get("dataset") or {"format": "parquet"})
    ds_meta["files"] = [os.path.relpath(f.resolve(), base) for f in ds.files]
    meta["dataset"] = ds_meta
    meta["window"] = {
        "source": os.path.relpath(where.resolve(), base),
        "ranks": list(flt.ranks) if flt.ranks is not None else None,
        "steps": list(flt.steps) if flt.steps is not None else None,
        "ops": list(flt.ops) if flt.ops is not None else None,
        "kinds": list(flt.kinds) if flt.kinds is not None else None,
        "t_start_ns": list(flt.t_start_ns) if flt.t_start_ns is not None else None,
        "calls": n,
    }
    meta["created"] = now_iso()
    dest.parent.mkdir(parents=True, exist_ok=True)
    return write_trace(dest, meta, frames, metas, limit=max(n, 1),
                       description=f"export: {_describe_window(flt)}")


def _describe_window(flt: Any) -> str:
    parts = []
    if flt.ranks is not None:
        parts.append(f"ranks {format_ranges(flt.ranks) or 'none'}")
    if flt.steps is not None:
        a, b = flt.steps
        parts.append(f"step {a}" if a == b else f"steps {a}-{b}")
    if flt.ops is not None:
        parts.append("ops " + ",".join(flt.ops))
    if flt.kinds is not None:
        parts.append("kinds " + ",".join(flt.kinds))
    if flt.t_start_ns is not None:
        lo, hi = flt.t_start_ns
        parts.append(f"starting in [{lo / 1e6:g}, {hi / 1e6:g}) ms")
    return ", ".join(parts) or "every call"
