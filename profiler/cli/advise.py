"""`profiler advise TRACE [TRACE ...]`: the findings, ranked by what they cost.

    profiler advise out/main-job/fusion-on/trace.json
    profiler advise fused/trace.json unfused/trace.json --format json
    profiler advise TRACE --bench bench/trace.json   # transfers against the fabric

Each finding says what was found, the numbers behind it, its cost in ms per step
(with a 95% interval) and in images/sec, what to change and the command that
checks it.  Findings whose cost does not clear the run-to-run noise are listed
last, in one line each; then what the trace cannot support.  Exit status 0, also
when there is no significant finding.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "advise", help="ranked findings with their cost: what to change, and why",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", help="trace.json files or profile directories")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--bench", metavar="BENCH",
                   help="a `profiler bench` trace of the same fabric (hosts, ranks, "
                        "transport): what the transfers are measured against")
    return p


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.findings import advise

    advices = [advise(t, bench=args.bench) for t in args.traces]
    if args.format == "json":
        import orjson

        doc: Any = [a.to_dict() for a in advices]
        sys.stdout.buffer.write(orjson.dumps(doc if len(doc) > 1 else doc[0],
                                             option=orjson.OPT_INDENT_2
                                             | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        return 0
    width = shutil.get_terminal_size((100, 24)).columns
    for i, a in enumerate(advices):
        if i:
            print()
        print(render(a, width=width))
    return 0


def _cost(f: Any) -> str:
    from profiler.units import fmt_ms

    if f.cost_ms is None:
        return ""
    text = f"cost: {fmt_ms(f.cost_ms)}/step"
    if f.cost_interval_ms:
        lo, hi = f.cost_interval_ms
        text += f" [{fmt_ms(lo)}, {fmt_ms(hi)}]"
    if f.cost_img_s:
        text += f", ~{f.cost_img_s:.0f} img/s"
    return f"[{text}]"


def header_line(a: Any) -> str:
    from profiler.errors import printable
    from profiler.units import fmt_ms

    h = a.header
    seen = h.get("ranks_analysed", h["ranks"])
    parts = [f"{h['ranks']} rank(s) on {h['hosts']} host(s)"
             + (f" ({h['interconnect']})" if h.get("interconnect") else "")
             + ((f", {seen} of them in the window analysed" if h.get("window")
                 else f", {seen} of them with records") if seen < h["ranks"] else "")]
    if h.get("steps"):
        parts.append(f"{h['steps']} steps, {fmt_ms(h['step_ms'])}/step")
        if h.get("images_per_s") == h.get("images_per_s") and h.get("images_per_s"):
            parts.append(f"{h['images_per_s']:.0f} img/s")
    return f"{printable(a.path)}: " + ", ".join(parts)


def render(a: Any, *, width: int = 100) -> str:
    """The advice as text a person reads in ten seconds, wrapped to `width`."""
    width = max(60, min(int(width), 160))
    out = textwrap.wrap(header_line(a), width=width, subsequent_indent="  ") + [""]
    wrap = textwrap.TextWrapper(width=width, initial_indent="   ", subsequent_indent="   ")
    sig = a.significant
    for n, f in enumerate(sig, 1):
        head, cost = f"{n}. {f.headline}", _cost(f)
        if cost and len(head) + len(cost) + 2 <= width:
            out.append(head + " " * (width - len(head) - len(cost)) + cost)
        else:
            out += textwrap.wrap(head, width=width, subsequent_indent="   ")
            if cost:
                out += wrap.wrap(cost)
        for d in f.details:
            out += wrap.wrap(d)
        if f.recommendation:
            out += wrap.wrap("try: " + f.recommendation)
        if f.check:
            out += wrap.wrap("check: " + f.check)
        out.append("")
    if not sig:
        out += ["no significant finding: nothing measured here costs more than the "
                "run-to-run noise.", ""]
    minor = a.minor
    if minor:
        out.append("Below the noise floor:")
        for f in minor:
            out += wrap.wrap(f"{f.headline} {_cost(f)}".rstrip())
        out.append("")
    if a.limits:
        out.append("Cannot conclude:")
        for f in a.limits:
            out += wrap.wrap(f.headline + (f": {f.details[0]}" if f.details else ""))
    return "\n".join(out).rstrip()
