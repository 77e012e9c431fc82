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


def _comm_label(c: Any) -> str:
    return f"{c.name} ({c.comm:#x})" if c.name else f"{c.comm:#x}"


def render(dg: Any) -> list[str]:
    from profiler.errors import printable

    out = [f"{dg.directory}: {len(dg.ranks)} rank file(s) of {dg.world_size}"
           + (", hang snapshot present" if dg.snapshot else "")]
    if dg.missing_ranks:
        out.append(f"  ranks with no file: {dg.missing_ranks}")
    by_rank = {r.rank: r for r in dg.ranks}
    for r in dg.ranks:
        what = ", ".join(f"{f['op']} seq {f['seq']}" for f in r.in_flight) or "no collective"
        out.append(f"  rank {r.rank} ({r.host or '?'}): {r.state}; in flight: {what}")
    for r in dg.ranks:
        if r.state == "dead":
            out.append(f"rank {r.rank} DIED (its process is gone and its file says it never "
                       "finished): the others wait for a rank that will not come")
    for c in dg.comms:
        head = f"comm {_comm_label(c)}, seq {c.seq}:"
        if c.mismatch:
            parts = "; ".join(f"rank(s) {','.join(map(str, rs))} in {op}"
                              for op, rs in sorted(c.mismatch.items()))
            out.append(f"{head} MISMATCH: different collectives at the same call: {parts}")
        entered = ", ".join(f"rank {r} {v}" for r, v in sorted(c.entered.items()))
        if c.never:
            out.append(f"{head} entered by {entered or 'no rank'}; NEVER entered by rank(s) "
                       f"{','.join(map(str, c.never))}")
            for rk in c.never:
                r = by_rank.get(rk)
                if r is None:
                    continue
                doing = ", ".join(f"{f['op']} on comm {f['comm']:#x} seq {f['seq']}"
                                  for f in r.in_flight) or "no collective in flight"
                last = (f"last completed: {r.last['op']} seq {r.last['seq']} at "
                        f"{r.last['t_start_s']:.3f} s" if r.last else "no completed call")
                out.append(f"  rank {rk} instead: {doing}; {last}"
                           + (f"; Python: {r.stack}" if r.stack else ""))
        elif not c.mismatch:
            out.append(f"{head} every rank entered it: {entered}")
    for g in dg.tensors:
        when = ", ".join(f"rank {r} at {t:.3f} s" for r, t in sorted(g.submitted.items()))
        out.append(f"tensor {g.tensor} (submission #{g.occurrence}): handed to Horovod by "
                   f"{when}; NEVER by rank(s) {','.join(map(str, g.missing))}: Horovod "
                   "waits for every rank to submit a tensor (hvd.synchronize blocks)")
        for rk in g.missing:
            out.append(f"  rank {rk}'s last tensor: {g.missing_last.get(rk, '?')}")
    if not dg.stuck:
        out.append("nothing is stuck: no collective in flight, every rank at the same call")
    elif not dg.snapshot:
        out.append("no hang snapshot (Python stacks): the watchdog writes one after "
                   "HOROVOD_PROFILE_HANG_S seconds (default 120)")
    return [printable(x) for x in out]


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.hang import diagnose

    dg = diagnose(args.directory)
    if args.format == "json":
        import orjson

        sys.stdout.buffer.write(orjson.dumps(dg.to_dict(), option=orjson.OPT_INDENT_2
                                             | orjson.OPT_NON_STR_KEYS
                                             | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    else:
        print("\n".join(render(dg)))
    return 1 if dg.stuck else 0
