"""`profiler hang DIR`: who is stuck where, and why, from a profile directory.

    profiler hang horovod-profile-...        # a live job, or one that was killed
    profiler hang DIR --format json

Works on a live job's directory, on one killed by a scheduler and after SIGKILL
of every rank: each rank's raw file holds its completed calls and the
collective each thread is blocked in (the flight recorder).  For each
communicator it names the first sequence number at which the ranks disagree,
the ranks that entered it and the ranks that never did, with what those are
doing instead; different collectives at the same sequence number; ranks that
died; tensors handed to Horovod by some ranks and never by others (Horovod's
own hang: every MPI call completes, hvd.synchronize waits).  With a hang
snapshot (the watchdog, HOROVOD_PROFILE_HANG_S) it adds each rank's Python
stack.  Exit status 0 when nothing is stuck, 1 when something is.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "hang", help="diagnose a hung (or killed) job: who is stuck in which call, and why",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", help="the profile directory (holding raw/)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    return p


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.facade import TraceAnalysis

    dg = TraceAnalysis.open_raw(args.directory).hang()
    if args.format == "json":
        import orjson

        sys.stdout.buffer.write(orjson.dumps(dg.to_dict(), option=orjson.OPT_INDENT_2
                                             | orjson.OPT_NON_STR_KEYS
                                             | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    else:
        print("\n".join(dg.lines()))
    return 1 if dg.stuck else 0
