"""`profiler predict TRACE`: the profiled job at another scale, fabric or setting.

    profiler predict trace.json [--hosts N] [--ranks-per-host K]
                     [--link RATE[,LATENCY] | --fabric BENCH]
                     [--fusion-threshold BYTES] [--cycle-time MS] [--batch-size B]
                     [--cores N] [--layout allreduce|ps:S] [--format table|json]

Prints the predicted step time with its 95% interval and images/sec, the
predicted breakdown (compute, waiting for other ranks, waiting for Horovod,
transfer), the collective algorithm assumed per message size, and every
assumption made, one line each.  Options left out stay as profiled.

--link RATE[,LATENCY]: the link between hosts, e.g. 10gbit, 100gbit,2us,
50mbit,0.1ms (without a latency: the profile's own per message).
--fabric BENCH: a `profiler bench` result of the target fabric (its
directory, trace.json or bench.json): its allreduce curve prices the
transfers.  Without either, the profile's own transfers do.
--cores N: the cores the whole job's ranks share (a job packed onto fewer
cores than it has ranks, or simulated hosts on one machine): compute's CPU
part, the transfers' CPU side and each collective step's wait for a partner
grow with the ranks to a core.  Default: each rank keeps the cores it had.
--layout ps:S: push and pull through S parameter servers on hosts of their
own (the MXNet proposal's layout) instead of allreduce.

The model (profiler.analysis.predict) and its validation on jobs it never
saw: docs/guide/predict.md.  Where the profile cannot carry a prediction
(too few steps, more ranks than its measured arrivals reach, another fusion
threshold without a lineage) it says why and prints no number: exit status 1.
Bad input (a trace without steps, a rate that does not parse, a layout it
cannot model): one line, exit status 2.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "predict", help="the profiled job at another scale, link, fusion or cycle setting",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="trace.json or profile directory")
    p.add_argument("--hosts", type=int, metavar="N", help="hosts (default: as profiled)")
    p.add_argument("--ranks-per-host", type=int, metavar="K",
                   help="ranks per host (default: as profiled)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--link", metavar="RATE[,LATENCY]",
                   help="the link between hosts: 10gbit, 100gbit,2us")
    g.add_argument("--fabric", metavar="BENCH", help="a `profiler bench` result of the fabric")
    p.add_argument("--fusion-threshold", metavar="BYTES",
                   help="HOROVOD_FUSION_THRESHOLD (bytes, or 64M; 0: fusion off)")
    p.add_argument("--cycle-time", type=float, metavar="MS", help="HOROVOD_CYCLE_TIME in ms")
    p.add_argument("--batch-size", type=int, metavar="B", help="images per rank and step")
    p.add_argument("--cores", type=int, metavar="N",
                   help="cores the whole job's ranks share (default: each rank keeps the "
                        "cores it had in the profile)")
    p.add_argument("--layout", default="allreduce", metavar="allreduce|ps:S",
                   help="allreduce (default) or ps:S, S parameter servers")
    p.add_argument("--format", choices=("table", "json"), default="table")
    return p


def _bench_trace(arg: str) -> Path:
    """A bench result: its directory, trace.json or bench.json."""
    from profiler.errors import NotFoundError

    p = Path(arg)
    if p.is_dir():
        p = p / "trace.json"
    elif p.name != "trace.json" and p.suffix == ".json":
        p = p.parent / "trace.json"
    if not p.is_file():
        raise NotFoundError(arg, "no bench trace (trace.json) here: give a `profiler bench -o "
                                 "DIR` result")
    return p


def target_of(args: argparse.Namespace) -> Any:
    from profiler.analysis.facade import Target, parse_layout, parse_link
    from profiler.bench import parse_size
    from profiler.errors import UsageError

    for name in ("hosts", "ranks_per_host", "batch_size", "cores"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise UsageError(None, f"--{name.replace('_', '-')} must be >= 1, not {v}")
    if args.cycle_time is not None and not (0 < args.cycle_time <= 10_000):
        raise UsageError(None, f"--cycle-time {args.cycle_time:g}: give milliseconds above 0")
    threshold = None
    if args.fusion_threshold is not None:
        threshold = parse_size(str(args.fusion_threshold))
    return Target(hosts=args.hosts, ranks_per_host=args.ranks_per_host,
                  link=parse_link(args.link) if args.link else None,
                  fusion_threshold=threshold, cycle_ms=args.cycle_time,
                  batch_size=args.batch_size, layout=parse_layout(args.layout),
                  cores=args.cores)


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.facade import TraceAnalysis
    from profiler.layout import resolve_trace

    target = target_of(args)  # bad input first, before reading anything
    trace = str(resolve_trace(args.trace))
    fabric = TraceAnalysis.open(_bench_trace(args.fabric), engine="pandas") if args.fabric \
        else None
    pred = TraceAnalysis.open(trace, engine="pandas").predict(target, fabric=fabric)
    if args.format == "json":
        import orjson

        sys.stdout.write(orjson.dumps(pred.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY
                                      | orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render(args.trace, pred))
    return 1 if pred.refused else 0


def render(name: str, pred: Any) -> str:
    from profiler.analysis.facade import BREAKDOWN_LABELS as LABELS
    from profiler.units import fmt_bytes, fmt_ms, fmt_number

    # as advise wraps: to the terminal's width, a long line's rest indented
    width = shutil.get_terminal_size((100, 24)).columns

    def fit(text: str, first: str = "", rest: str = "  ") -> list[str]:
        return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest)

    m = pred.measured
    head = fit(f"{name}: profiled {m.get('ranks')} rank(s) on {m.get('hosts')} host(s), "
               f"{fmt_ms(m.get('step_ms'))}/step, {fmt_number(m.get('images_per_s'))} img/s")
    if pred.refused:
        return "\n".join(head + fit(f"no prediction at {pred.ranks} ranks: {pred.refused}"))
    lo, hi = pred.interval
    ilo, ihi = pred.images_interval
    lines = [*head,
             *fit(f"predicted at {pred.ranks} rank(s) on {pred.hosts} host(s): "
                  f"{fmt_ms(pred.step_ms)}/step [{fmt_ms(lo)}, {fmt_ms(hi)}] (95%), "
                  f"{fmt_number(pred.images_per_s)} img/s [{fmt_number(ilo)}, "
                  f"{fmt_number(ihi)}]"),
             "", "Where a step would go:"]
    measured = m.get("breakdown") or {}
    for part, ms in pred.breakdown.items():
        was = measured.get(part)
        lines.append(f"  {LABELS[part]:26}{fmt_ms(ms):>11}"
                     + (f"   (profiled {fmt_ms(was)})" if was is not None else ""))
    if pred.algorithms:
        lines += ["", "Collective algorithm assumed per message size:"]
        for a in pred.algorithms:
            rng = (fmt_bytes(a["min_bytes"]) if a["min_bytes"] == a["max_bytes"]
                   else f"{fmt_bytes(a['min_bytes'])}-{fmt_bytes(a['max_bytes'])}")
            lines.append(f"  {rng:>22}  {a['library']}: {a['algorithm']} "
                         f"({a['calls_per_step']} call(s) in a step)")
    lines += ["", "Assumptions:"] + [w for a in pred.assumptions for w in fit(a, "  - ", "    ")]
    return "\n".join(lines)
