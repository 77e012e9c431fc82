"""`profiler check TRACE`: cross-rank consistency of a job that finished.

    profiler check horovod-profile-.../trace.json [--format json]

For every collective, identified on each rank by (communicator, sequence
number), the ranks must agree on the operation, datatype, reduction, root and,
where every rank passes the same count, the size; and on each communicator
every rank must have made the same number of calls.  Exit status 0 when all
is consistent, 1 when something is not (each finding on one line), 2 for bad
input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

SHOWN = 20


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "check", help="cross-rank consistency: the same call on every rank (exit 1 if not)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="trace.json, a profile directory or a parquet file")
    p.add_argument("--format", choices=("text", "json"), default="text")
    return p


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.facade import TraceAnalysis
    from profiler.errors import printable

    res = TraceAnalysis.open(args.trace, engine="pandas").check()
    bad, short, ok = res.mismatches, res.call_counts, res.consistent
    if args.format == "json":
        import orjson

        doc = {"trace": args.trace, "consistent": ok,
               "mismatches": bad.to_dict(orient="records"),
               "call_counts": short.to_dict(orient="records")}
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2
                                             | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        return 0 if ok else 1
    import shutil
    import textwrap

    width = max(60, shutil.get_terminal_size((120, 24)).columns)

    def say(text: str) -> None:
        print("\n".join(textwrap.wrap(printable(text), width=width, subsequent_indent="    ",
                                       break_on_hyphens=False, break_long_words=True)))

    if ok:
        say(f"{args.trace}: consistent: every rank made the same calls "
            f"({res.records} records, {res.ranks} ranks)")
        return 0
    say(f"{args.trace}: INCONSISTENT: {len(bad)} mismatched call field(s), "
        f"{len(short)} rank(s) with missing calls")
    for r in bad.head(SHOWN).itertuples(index=False):
        say(f"  comm {r.comm:#x} seq {r.seq}: {r.field} differs ({r.values})")
    if len(bad) > SHOWN:
        print(f"  ... {len(bad) - SHOWN} more (--format json lists every one)")
    for r in short.head(SHOWN).itertuples(index=False):
        say(f"  comm {int(r.comm):#x}: rank {r.rank} made {r.calls} calls, "
            f"others {r.expected} (its last seq {r.last_seq})")
    return 1
