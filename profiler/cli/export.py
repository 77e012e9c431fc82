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
import sys
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


def run(args: argparse.Namespace) -> int:
    from profiler.postjob.export import export_window

    if args.limit < 0:
        raise UsageError(None, "--limit must be >= 0")
    if not args.output.lower().endswith(".json"):
        raise UsageError(args.output, "the window is a trace: name it *.json")
    window: dict[str, Any] = {
        "ranks": parse_ranges(args.ranks) if args.ranks else None,
        "steps": parse_span(args.steps) if args.steps else None,
        "ops": parse_names(args.ops) if args.ops else None,
        "kinds": parse_names(args.kinds) if args.kinds else None,
        "t_start_ns": parse_time_ms(args.time_ms) if args.time_ms else None,
    }
    meta = export_window(args.trace, args.output, limit=args.limit, **window)
    ev = meta["events"]
    print(f"profiler: window written to {args.output} ({ev['included']} calls: "
          f"{ev['selection'].removeprefix('export: ')})", file=sys.stderr)
    return 0
