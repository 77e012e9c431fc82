"""`profiler merge DIR`: turn a profile directory into trace.json (crashed jobs too)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "merge", help="merge a profile directory's per-rank files into trace.json",
        description="Convert every raw file lacking an up-to-date parquet file, report "
                    "missing and partial (killed) ranks, and write DIR/trace.json.")
    p.add_argument("directory", help="profile directory (holds raw/ and ranks/)")
    p.add_argument("-o", "--output", help="trace path (default DIR/trace.json)")
    p.add_argument("--events", type=int, default=None, metavar="N",
                   help="at most N call events in trace.json (default: "
                        "HOROVOD_PROFILE_TRACE_EVENTS or 500000)")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-rank problem lines")
    return p


def run(args: argparse.Namespace) -> int:
    from profiler.errors import UsageError
    from profiler.postjob.merge import merge

    if args.events is not None and args.events < 0:
        raise UsageError(None, "--events must be >= 0")
    result = merge(args.directory, out=args.output, limit=args.events)
    if not args.quiet:
        for problem in result.problems:
            print(f"profiler: warning: {problem}", file=sys.stderr)
    print(f"profiler: trace written to {result.summary_line()}")
    return 0
