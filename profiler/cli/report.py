"""`profiler report TRACE [TRACE ...] -o report.html`: one standalone HTML report.

    profiler report trace.json -o report.html
    profiler report fused/trace.json unfused/trace.json --labels fused,unfused -o ab.html

The file works offline (plotly.js is embedded once): traces and environment,
summary tables, message sizes (fused vs unfused with several traces), latency
vs size with percentile bands, the fitted alpha-beta model and anomalies,
padding what-if, per-rank imbalance, per-step timeline and images/sec, control
vs data share, fusion lineage, and a comparison of the traces.  Every string
from the traces is HTML-escaped.  A progress bar shows on stderr while it builds.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "report", help="standalone offline HTML report of one or more traces",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", help="trace.json files or profile directories")
    p.add_argument("-o", "--output", required=True, help="HTML file to write")
    p.add_argument("--labels", default=None, help="comma-separated, one per trace")
    p.add_argument("--title", default=None, help="report title")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.facade import TraceAnalysis
    from profiler.errors import UsageError

    labels = None
    if args.labels:
        labels = [x.strip() for x in args.labels.split(",")]
        if len(labels) != len(args.traces) or len(set(labels)) != len(labels):
            raise UsageError(None, f"--labels: give {len(args.traces)} distinct labels")
    if not args.output.lower().endswith((".html", ".htm")):
        raise UsageError(args.output, "the report is HTML: name it *.html")
    first, *others = [TraceAnalysis.open(t, engine="pandas") for t in args.traces]
    out = first.report(args.output, *others, labels=labels, title=args.title,
                       progress=not args.no_progress and sys.stderr.isatty())
    size = out.stat().st_size
    print(f"profiler: report written to {out} ({size / 1e6:.1f} MB)", file=sys.stderr)
    return 0
