"""`profiler synth SRC -o DIR --ranks N`: a realistic N-rank dataset from a small real trace.

    profiler synth small-run/trace.json -o big --ranks 1024 --calls-per-rank 100000
                   [--stragglers 4] [--seed 0]

SRC is a real profile (trace.json, profile directory or a rank's parquet file).
DIR gets ranks/rank-RRRRR.parquet + .json for every rank and trace.json, as a
real N-rank job would leave them: the source rank's calls (ops, message sizes,
kinds, threads, steps) repeated to --calls-per-rank calls, with per-rank arrival
jitter, clock offsets, and --stragglers ranks that arrive late at a share of
the collectives (recorded in trace.json under "synthetic", with each one's
delays per step under "synthetic.injected").  Where the source has
synchronize marks (Horovod's DistributedOptimizer), a straggler's arrival at
synchronize moves with its delay, as a real late rank's does; a rank whose
arrivals and collectives would disagree is refused.  The model is described
in profiler/synth.py.  The same arguments give the same dataset.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "synth", help="generate an N-rank dataset from a small real trace",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="real profile: trace.json, profile directory or parquet file")
    p.add_argument("-o", "--output", required=True, help="directory to write")
    p.add_argument("--ranks", type=int, required=True, metavar="N", help="ranks to generate")
    p.add_argument("--calls-per-rank", type=int, default=None, metavar="M",
                   help="communication calls per rank (default: the source rank's)")
    p.add_argument("--stragglers", type=int, default=2, metavar="K",
                   help="straggler ranks to inject (default 2)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--straggler-share", type=float, default=0.25, metavar="F",
                   help="share of the collectives delayed by a straggler (default 0.25)")
    p.add_argument("--straggler-delay-us", type=float, default=50.0, metavar="US",
                   help="median straggler delay (default 50 us)")
    p.add_argument("--jitter-us", type=float, default=2.0, metavar="US",
                   help="per-rank arrival jitter scale (default 2 us)")
    p.add_argument("--template-rank", type=int, default=0, metavar="R",
                   help="source rank whose calls every rank makes (default 0)")
    p.add_argument("--ranks-per-host", type=int, default=8, metavar="R",
                   help="ranks per generated host (default 8)")
    p.add_argument("--force", action="store_true", help="replace a non-empty DIR")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    return p


def run(args: argparse.Namespace) -> int:
    from profiler.errors import UsageError
    from profiler.synth import SynthConfig, synthesize

    if args.straggler_delay_us < 0 or args.jitter_us < 0:
        raise UsageError(None, "delays and jitter must be >= 0")
    cfg = SynthConfig(ranks=args.ranks, calls_per_rank=args.calls_per_rank,
                      stragglers=args.stragglers, seed=args.seed,
                      straggler_share=args.straggler_share,
                      straggler_delay_ns=int(round(args.straggler_delay_us * 1e3)),
                      jitter_ns=int(round(args.jitter_us * 1e3)),
                      template_rank=args.template_rank, ranks_per_host=args.ranks_per_host)
    tty = sys.stderr.isatty() and not args.quiet

    def progress(done: int, total: int) -> None:
        if tty and (done == total or done % 16 == 0):
            print(f"\rprofiler synth: {done}/{total} ranks", end="", file=sys.stderr,
                  flush=True)

    res = synthesize(args.source, args.output, cfg, force=args.force, progress=progress)
    if tty:
        print(file=sys.stderr)
    strag = ",".join(map(str, res.stragglers)) or "none"
    print(f"profiler: synthetic dataset written to {res.trace} ({res.ranks} ranks, "
          f"{res.calls} calls, {res.dataset_bytes / 1e6:.1f} MB parquet, "
          f"{res.dataset_bytes / max(res.calls, 1):.1f} bytes/call; stragglers: {strag}; "
          f"{res.seconds:.1f} s)")
    return 0
