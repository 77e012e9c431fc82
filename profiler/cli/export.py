"""`profiler export TRACE -o window.json`: a Perfetto-loadable window of a big trace.

    profiler export run/ --ranks 0-7 --steps 10-20 -o window.json
    profiler export run/trace.json --ranks 0,512-515 --ops allreduce --time-ms 1000:1200 -o w.json

TRACE is a trace.json, a profile directory or a parquet file.  The window is read
from the per-rank parquet dataset with the filters pushed down (only the files of
the asked ranks are opened): --ranks (list of ranks and ranges), --steps (one step
or a range, inclusive), --ops and --kinds (comma-separated), --time-ms (start
times in [A, B) ms on the job axis).  The output is a trace.json: the job's
metadata, the window's filters under "window", every call of the window as an
event.  `profiler.analysis.load(window.json)` and `profiler summarize window.json`
read it back as the window (from the dataset, every column; from the window's
events when the dataset is out of reach).  --limit refuses windows of more calls
(default 2000000; 0: no limit).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from profiler.cli._args import parse_names, parse_span, parse_time_ms
from profiler.errors import UsageError
from profiler.layout import parse_ranges

DEFAULT_LIMIT = 2_000_000


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "export", help="write a Perfetto-loadable window (ranks, steps, ops) of a trace",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="trace.json, profile directory or parquet file")
    p.add_argument("-o", "--output", required=True, help="trace file to write (*.json)")
    p.add_argument("--ranks", default=None, metavar="LIST", help="ranks, e.g. 0-7,12")
    p.add_argument("--steps", default=None, metavar="A-B", help="steps, e.g. 10-20 or 15")
    p.add_argument("--ops", default=None, metavar="LIST", help="ops, e.g. allreduce,bcast")
    p.add_argument("--kinds", default=None, metavar="LIST", help="kinds, e.g. data,control")
    p.add_argument("--time-ms", default=None, metavar="A:B",
                   help="calls starting in [A, B) ms on the job axis")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                   help=f"refuse windows of more than N calls (default {DEFAULT_LIMIT}; 0: none)")
    return p


def export_window(path: str | os.PathLike[str], out: str | os.PathLike[str], *,
                  ranks: list[int] | None = None, steps: tuple[int, int] | None = None,
                  ops: list[str] | None = None, kinds: list[str] | None = None,
                  t_start_ns: tuple[int, int] | None = None,
                  limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Write the window; returns its metadata block."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    from profiler.analysis.engine import open_dataset
    from profiler.analysis.filters import RowFilter
    from profiler.analysis.load import read_files
    from profiler.errors import CorruptError, NotATraceError, ProfilerError
    from profiler.formats.dataset import read_meta
    from profiler.formats.tracejson import TRACE_FORMAT_VERSION, now_iso, write_trace
    from profiler.layout import file_rank

    src = Path(path)
    dest = Path(out)
    if dest.is_dir():
        raise UsageError(dest, "is a directory; give the window's file name")
    ds = open_dataset(src)
    if ds is None:
        raise NotATraceError(src, "no parquet dataset to export from (raw files only, or the "
                                  "trace's dataset is gone; run `profiler merge` first)")
    if ds.aggregated:
        raise UsageError(src, "a summary-mode trace has aggregates, not calls: nothing to "
                              "export")
    asked = RowFilter.of(ranks=ranks, steps=steps, ops=ops, kinds=kinds, t_start_ns=t_start_ns)
    flt = ds.filtered(asked) or RowFilter()
    files = ds.files_for(flt)
    if ranks is not None:
        have = ds.ranks()
        if have is not None:
            absent = [r for r in ranks if r not in set(have)]
            if len(absent) == len(ranks):
                from profiler.layout import format_ranges

                raise UsageError(src, f"none of the asked ranks is in this trace (ranks: "
                                      f"{format_ranges(have) or 'none'})")
    try:
        dataset = pads.dataset([str(f) for f in files], format="parquet")
        n = int(dataset.count_rows(filter=flt.expression(dataset.schema.names)))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptError(src, f"unreadable parquet dataset: {exc}") from None
    if limit and n > limit:
        raise UsageError(src, f"the window holds {n} calls, over the limit of {limit}: narrow "
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
        m: dict[str, Any] = {"rank": rank, "host": "", "tracks": []}
        if js.is_file():
            try:
                m = read_meta(js)
            except ProfilerError:
                pass
        frames.append(part)
        metas.append(m)
    base = dest.resolve().parent
    meta = dict(ds.meta or {"format_version": TRACE_FORMAT_VERSION})
    ds_meta = dict(meta.get("dataset") or {"format": "parquet"})
    ds_meta["files"] = [os.path.relpath(f.resolve(), base) for f in ds.files]
    meta["dataset"] = ds_meta
    meta["window"] = {
        "source": os.path.relpath(src.resolve(), base),
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
                       description=f"export: {_describe(flt)}")


def _describe(flt: Any) -> str:
    from profiler.layout import format_ranges

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


def run(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise UsageError(None, "--limit must be >= 0")
    if not args.output.lower().endswith(".json"):
        raise UsageError(args.output, "the window is a trace: name it *.json")
    meta = export_window(
        args.trace, args.output,
        ranks=parse_ranges(args.ranks) if args.ranks else None,
        steps=parse_span(args.steps) if args.steps else None,
        ops=parse_names(args.ops) if args.ops else None,
        kinds=parse_names(args.kinds) if args.kinds else None,
        t_start_ns=parse_time_ms(args.time_ms) if args.time_ms else None,
        limit=args.limit)
    ev = meta["events"]
    print(f"profiler: window written to {args.output} ({ev['included']} calls: "
          f"{ev['selection'].removeprefix('export: ')})", file=sys.stderr)
    return 0
