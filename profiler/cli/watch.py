"""`profiler watch DIR`: a running job, live, from the files it already writes.

    profiler watch horovod-profile-...                 # refreshed every second
    profiler watch DIR --once --format json            # one snapshot, for scripts
    profiler watch DIR --prometheus :9464              # an HTTP /metrics endpoint
    profiler watch DIR --textfile /var/lib/node_exporter/hvprof.prom

Each refresh reads only what the ranks appended to raw/rank-R.hvprof since the
previous one (complete records of written chunks), the flight recorder and the
live counters of each file's header, and the summary-mode snapshots
(rank-R.agg).  The watcher opens the files read-only and takes no lock: the
job records exactly what it would without it.

The view fits 80 columns: the job's steps and images/sec (since start and over
the recent --window), the slowest rank, each rank's state, where a step goes
over the window (the parts of `profiler advise`'s breakdown), the top
collectives by time (calls/s per rank, mean size, bus bandwidth), calls in
flight for longer than --stuck-factor times their usual duration, ranks that
stopped writing (dead, or no heartbeat for --stale seconds), dropped records
and the profiler's own cost.  When every rank has closed its file (or died) it
shows the final state and exits, unless --follow.  Without a terminal it
prints a frame per refresh.  Exit status of --once: 0, or 1 when a rank
stopped or a call is stuck.

A watcher that keeps refreshing runs at the scheduler's idle priority (Linux
SCHED_IDLE, else nice 19; --priority normal keeps the one it was started
with): where it shares cores with the ranks it takes only time they leave, and
never preempts one.  --once keeps its priority (--priority idle to lower it):
one snapshot that someone waits for, which at idle priority would wait for as
long as ranks spinning in MPI keep every core busy.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from profiler.errors import UsageError
from profiler.formats import buckets as defaults

#: Rank rows in the terminal view (stopped and slowest ranks first, then by rank).
MAX_RANK_ROWS = 12


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return v


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    try:
        p = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected [HOST]:PORT, got {text!r}") from None
    if not 0 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {text!r}")
    return host.strip("[]") or "0.0.0.0", p


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "watch", help="watch a running job live (terminal view, JSON, Prometheus exporter)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", help="the profile directory (holding raw/)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text (the view), or json (one object per refresh)")
    p.add_argument("--interval", type=_positive, default=defaults.INTERVAL_S, metavar="S",
                   help="seconds between refreshes (default %(default)g)")
    p.add_argument("--window", type=_positive, default=defaults.WINDOW_S, metavar="S",
                   help="the recent window for rates, in seconds (default %(default)g)")
    p.add_argument("--stuck-factor", type=_positive, default=defaults.STUCK_FACTOR, metavar="N",
                   help="a call in flight N times its usual duration (and >= 1 s) is "
                        "stuck (default %(default)g)")
    p.add_argument("--stale", type=_positive, default=defaults.STALE_S, metavar="S",
                   help="a rank whose heartbeat did not move for S seconds has stopped "
                        "writing (default %(default)g)")
    p.add_argument("--follow", action="store_true",
                   help="keep watching after every rank has finished (until Ctrl-C)")
    p.add_argument("--top", type=_count, default=5, metavar="N",
                   help="collectives shown (default 5)")
    p.add_argument("--prometheus", type=_address, metavar="[HOST]:PORT",
                   help="serve the metrics over HTTP (/metrics) while watching")
    p.add_argument("--textfile", metavar="PATH",
                   help="rewrite PATH with the metrics at each refresh (node_exporter's "
                        "textfile collector)")
    p.add_argument("--priority", choices=("idle", "normal"), default=None,
                   help="idle (default, but for --once): run only on time the job leaves "
                        "(SCHED_IDLE, else nice 19); normal (--once's default): the "
                        "priority it was started with")
    p.add_argument("--max-rank-labels", type=_count, default=64, metavar="N",
                   help="ranks with series of their own; the others are rank=\"other\" "
                        "(default 64)")
    p.add_argument("--max-host-labels", type=_count, default=64, metavar="N",
                   help="host names kept as label values; the others are host=\"other\" "
                        "(default 64)")
    return p


def lower_priority() -> str:
    """This process (every thread it starts from now on) at the idle scheduling
    class, else at nice 19: which one it got ("idle", "nice", or "" when
    neither was allowed)."""
    import os

    def nice() -> str:
        try:
            os.nice(19 - os.nice(0))
            return "nice"
        except OSError:
            return ""

    if not hasattr(os, "sched_setscheduler"):  # not Linux
        return nice()
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "idle"
    except OSError:  # a sandbox that refuses the idle class
        return nice()


def priority_of(args: argparse.Namespace) -> str:
    """--priority as given; else normal for --once, idle for a watcher that keeps
    refreshing (module doc)."""
    return getattr(args, "priority", None) or ("normal" if args.once else "idle")


def run(args: argparse.Namespace) -> int:
    import threading

    from profiler.analysis.facade import TraceAnalysis

    if priority_of(args) == "idle":
        lower_priority()

    watcher = TraceAnalysis.open_raw(args.directory).watch(
        window_s=args.window, stuck_factor=args.stuck_factor, stale_s=args.stale)
    lock = threading.Lock()
    registry = None
    if args.prometheus or args.textfile:
        from profiler.cli._prometheus import make_registry

        registry = make_registry(watcher, lock, max_ranks=args.max_rank_labels,
                                 max_hosts=args.max_host_labels)
    if args.prometheus:
        from prometheus_client import start_http_server

        host, port = args.prometheus
        assert registry is not None
        try:
            start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise UsageError(None, f"--prometheus {host}:{port}: cannot listen: "
                                   f"{exc.strerror or exc}") from None
    try:
        if args.once:
            with lock:
                watcher.refresh()
            _publish(args, registry)
            with lock:
                snap = watcher.snapshot()
            if not snap["ranks"]:
                from profiler.errors import EmptyProfileError

                raise EmptyProfileError(watcher.directory, "no raw/rank-*.hvprof files (is "
                                        "the job profiled into this directory?)")
            _emit(args, snap)
            return 1 if snap["job"]["stopped_ranks"] or snap["job"]["stuck_calls"] else 0
        return _loop(args, watcher, lock, registry)
    finally:
        watcher.close()


def _publish(args: argparse.Namespace, registry: Any) -> None:
    if args.textfile and registry is not None:
        from prometheus_client import write_to_textfile

        try:
            write_to_textfile(args.textfile, registry)
        except OSError as exc:
            raise UsageError(args.textfile, f"cannot write: {exc.strerror or exc}") from None


def _emit(args: argparse.Namespace, snap: dict[str, Any]) -> None:
    if args.format == "json":
        import orjson

        sys.stdout.buffer.write(orjson.dumps(snap, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        sys.stdout.flush()
    else:
        print("\n".join(render(snap, top=args.top)), flush=True)


def _loop(args: argparse.Namespace, watcher: Any, lock: Any, registry: Any) -> int:
    live_view = args.format == "text" and sys.stdout.isatty()
    screen: Any = None
    if live_view:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        console = Console()
        screen = Live(Text("reading ..."), console=console, auto_refresh=False,
                      redirect_stdout=False, transient=False)
        screen.start()
    try:
        while True:
            t0 = time.monotonic()
            with lock:
                watcher.refresh()
                snap = watcher.snapshot()
            _publish(args, registry)
            if screen is not None:
                from rich.text import Text

                screen.update(Text("\n".join(render(snap, top=args.top)), no_wrap=True,
                                   overflow="ellipsis"), refresh=True)
            else:
                _emit(args, snap)
                if args.format == "text":
                    print(flush=True)
            if snap["finished"] and not args.follow:
                return 0
            time.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
    finally:
        if screen is not None:
            screen.stop()


# ---------------------------------------------------------------------------
# the view (80 columns)
# ---------------------------------------------------------------------------
def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def _breakdown_lines(bd: dict[str, Any] | None, window_s: float, width: int) -> list[str]:
    """Where a step goes over the window: a line per part that took time, its
    mean, share and a bar (as `profiler advise` shows it)."""
    from profiler.units import fmt_ms, fmt_number

    if not bd or not bd["step_ms"] > 0:
        return []
    bar_w = max(10, min(30, width - 50))
    out = ["", _cut(f"where a step goes ({bd['steps']} steps of the last "
                    f"{fmt_number(window_s)} s, mean of {bd['ranks']} ranks): "
                    f"{fmt_ms(bd['step_ms'])}", width)]
    for p in bd["parts"]:
        share = p["share"] or 0.0
        if p["ms"] <= 0.0005 * bd["step_ms"] and p["part"] != "compute":
            continue
        pct = "<1%" if 0 < share < 0.005 else f"{share:.0%}"
        bar = "\u2588" * int(round(max(share, 0.0) * bar_w))
        out.append(_cut(f"  {p['label']:<24} {fmt_ms(p['ms']):>9} {pct:>4}  {bar}", width))
    return out


def render(snap: dict[str, Any], *, top: int = 5, width: int = 80) -> list[str]:
    """The snapshot as the terminal view: lines of at most `width` characters."""
    from profiler.units import fmt_bw, fmt_bytes, fmt_count, fmt_number, fmt_share, fmt_us

    def secs(s: Any) -> str:
        return "-" if s is None else fmt_us(float(s) * 1e6)

    def num(x: Any) -> str:
        return "-" if x is None else fmt_number(x)

    job = snap["job"]
    ranks = [r for r in snap["ranks"] if "steps" in r]
    states: dict[str, int] = {}
    for r in snap["ranks"]:
        states[r["status"]] = states.get(r["status"], 0) + 1
    lines = [_cut(f"profiler watch  {snap['directory']}", width - 9).ljust(width - 9)
             + snap["time"][11:19].rjust(9)]
    st_text = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    lines.append(_cut(f"ranks {snap['ranks_seen']}/{snap['world_size']} ({st_text})"
                      f"   job time {secs(snap['elapsed_s'])}"
                      + ("   FINISHED" if snap["finished"] else ""), width))
    lines.append(_cut(f"steps {job['steps']}   images/s {num(job['images_per_sec'])} "
                      f"(last {fmt_number(snap['window_s'])} s: "
                      f"{num(job['images_per_sec_recent'])})", width))
    slow = job["slowest_rank"]
    if slow:
        lines.append(_cut(f"slowest rank {slow['rank']}: step {secs(slow['step_time_s'])} "
                          f"(median {secs(slow['median_step_time_s'])}, "
                          f"x{fmt_number(slow['ratio'])})", width))
    lines.append("")
    lines.append(f"{'rank':>5} {'host':<12} {'state':<9} {'steps':>6} {'img/s':>8} "
                 f"{'recent':>8} {'step':>9} {'comm':>9} {'drop':>5}")
    slowest = slow["rank"] if slow else None
    order = sorted(ranks, key=lambda r: (not r["stopped"], r["rank"] != slowest, r["rank"]))
    for r in sorted(order[:MAX_RANK_ROWS], key=lambda r: r["rank"]):
        lines.append(f"{r['rank']:>5} {_cut(r['host'], 12):<12} {r['status']:<9} "
                     f"{r['steps']:>6} {num(r['images_per_sec']):>8} "
                     f"{num(r['images_per_sec_recent']):>8} "
                     f"{secs(r['step_time_recent_s']):>9} {secs(r['comm_time_s']):>9} "
                     f"{fmt_number(r['dropped_records']):>5}")
    if len(ranks) > MAX_RANK_ROWS:
        lines.append(f"  ... {len(ranks) - MAX_RANK_ROWS} more ranks (stopped and slowest "
                     "shown first)")
    lines += _breakdown_lines(snap.get("breakdown"), snap["window_s"], width)
    lines.append("")
    lines.append(f"{'top collectives by time':<23} {'calls':>9} {'mean size':>10} "
                 f"{'calls/s':>8} {'busbw GB/s':>10} {'time':>8} {'share':>5}")
    for c in snap["collectives"][:top]:
        lines.append(f"{_cut(c['op'], 23):<23} {fmt_count(c['calls']):>9} "
                     f"{fmt_bytes(c['mean_bytes']) if c['mean_bytes'] is not None else '-':>10} "
                     f"{num(c['calls_per_s']):>8} "
                     f"{fmt_bw(c['busbw_gbps']) if c['busbw_gbps'] else '-':>10} "
                     f"{secs(c['time_s']):>8} {fmt_share(c['share']):>5}")
    if not snap["collectives"]:
        lines.append("  (none yet)")
    flying = snap["in_flight"]
    if flying:
        lines.append("")
        lines.append("in flight (longest first)")
        for f in flying[:5]:
            usual = f"usual {secs(f['usual_s'])}" if f["usual_s"] else "no history"
            where = f" on {f['comm']}" if f["comm"] else ""
            peer = f" peer {f['peer']} tag {f['tag']}" if "peer" in f else ""
            lines.append(_cut(f"  rank {f['rank']} {f['op']}{where}{peer} for "
                              f"{secs(f['age_s'])} ({usual})"
                              + ("  STUCK" if f["stuck"] else ""), width))
    stopped = [r for r in ranks if r["stopped"]]
    if stopped or snap["missing_ranks"]:
        lines.append("")
        parts = [f"rank {r['rank']} {r['status']}"
                 + (f" (no heartbeat for {secs(r['heartbeat_age_s'])})"
                    if r["status"] == "stalled" else "") for r in stopped[:4]]
        if snap["missing_ranks"]:
            parts.append(f"{len(snap['missing_ranks'])} rank(s) without a raw file")
        lines.append(_cut("stopped: " + "; ".join(parts), width))
    lines.append("")
    helper = job["profiler_helper_cpu_s"]
    share = job["profiler_cost_share_max"]
    lines.append(_cut(f"dropped records {fmt_number(job['dropped_records'])}   profiler "
                      f"cost {fmt_share(share) if share is not None else '-'} (worst rank), "
                      f"helper CPU {secs(helper)}", width))
    return [_cut(ln, width) for ln in lines]
