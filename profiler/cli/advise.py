"""`profiler advise TRACE [TRACE ...]`: the findings, ranked by what they cost.

    profiler advise out/main-job/fusion-on/trace.json
    profiler advise fused/trace.json unfused/trace.json --format json
    profiler advise TRACE --bench bench/trace.json   # transfers against the fabric
    profiler advise TRACE --confirm                  # replay flagged sizes alone

Each finding says what was found, the numbers behind it, its cost in ms per step
(with a 95% interval) and in images/sec, what to change and the command that
checks it, and what it was tested against.  It opens with where the step goes:
the step breakdown, whose parts sum to the step.  Findings that failed their
test, or whose test was not run, are listed under "Not claimed"; findings whose
cost does not clear the run-to-run noise after them, in one line each; then
what the trace cannot support.  Exit status 0, also when there is no
significant finding.

--confirm replays the message sizes the run flagged as slow, and their
neighbours, alone, at the job's rank count on this host with the job's MPI
settings (profiler bench's sweep; about a minute), and claims a latency cliff
only where the replay finds it too.  --replay TRACE uses such a replay made
before (or a `profiler bench` trace of the same sizes on the job's hosts).
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
    p.add_argument("--confirm", action="store_true",
                   help="replay the flagged message sizes alone (this host, the job's rank "
                        "count and MPI settings) before claiming a latency cliff")
    p.add_argument("--replay", metavar="TRACE",
                   help="a replay of the flagged sizes made before (written by --confirm)")
    return p


def _confirmed(trace: str, bench: str | None) -> Any:
    """advise(trace) with its flagged sizes replayed alone (--confirm)."""
    from pathlib import Path

    from profiler.analysis.facade import TraceAnalysis
    from profiler.bench.confirm import job_mpi_env, replay
    from profiler.errors import UsageError

    ta = TraceAnalysis.open(trace, engine="pandas")
    first = ta.advise(bench=bench, only=["latency_cliffs"])
    sizes = next((f.numbers.get("replay_sizes") for f in first.findings
                  if f.key == "latency_cliffs"), None)
    if not sizes:
        print(f"profiler: {trace}: no message size flagged: nothing to replay",
              file=sys.stderr)
        return ta.advise(bench=bench)
    if first.header.get("hosts", 1) > 1:
        raise UsageError(trace, f"--confirm replays on this host, the job ran on "
                                f"{first.header['hosts']}: run `profiler bench --sizes "
                                f"{','.join(map(str, sizes))}` on the job's hosts and pass "
                                "--replay BENCH/trace.json")
    meta = ta.meta or {}
    p = Path(trace)
    home = p if p.is_dir() else p.parent
    out = home / "confirm"
    n = 1
    while out.exists():
        n += 1
        out = home / f"confirm-{n}"
    rtrace = replay(sizes, np=int(first.header.get("ranks") or 2), out_dir=out,
                    job_env=job_mpi_env(meta))
    return ta.advise(bench=bench, replay=rtrace)


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.facade import TraceAnalysis

    if args.confirm and args.replay:
        from profiler.errors import UsageError

        raise UsageError(None, "give --confirm or --replay, not both")
    if args.confirm:
        advices = [_confirmed(t, args.bench) for t in args.traces]
    else:
        advices = [TraceAnalysis.open(t, engine="pandas").advise(bench=args.bench,
                                                                 replay=args.replay)
                   for t in args.traces]
    if args.format == "json":
        import orjson

        doc: Any = [a.to_dict() for a in advices]
        sys.stdout.buffer.write(orjson.dumps(doc if len(doc) > 1 else doc[0],
                                             option=orjson.OPT_INDENT_2
                                             | orjson.OPT_SERIALIZE_NUMPY
                                             | orjson.OPT_NON_STR_KEYS) + b"\n")
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
    text = f"{getattr(f, 'cost_label', 'cost') or 'cost'}: {fmt_ms(f.cost_ms)}/step"
    if f.cost_interval_ms:
        lo, hi = f.cost_interval_ms
        text += f" [{fmt_ms(lo)}, {fmt_ms(hi)}]"
    if f.cost_img_s:
        text += f", ~{f.cost_img_s:.0f} img/s"
    return f"[{text}]"


def header_line(a: Any) -> str:
    from profiler.errors import printable

    h = a.header
    seen = h.get("ranks_analysed", h["ranks"])
    parts = [f"{h['ranks']} rank(s) on {h['hosts']} host(s)"
             + (f" ({h['interconnect']})" if h.get("interconnect") else "")
             + ((f", {seen} of them in the window analysed" if h.get("window")
                 else f", {seen} of them with records") if seen < h["ranks"] else "")]
    steps = step_figures_text(h)
    if steps:
        parts.append(steps)
    return f"{printable(a.path)}: " + ", ".join(parts)


def step_figures_text(h: dict[str, Any]) -> str:
    """'12 steps, 31.00 ms/step, 1290 img/s' from an advice header (the step
    time and images/sec of every door, profiler.formats.steps); "" without
    steps.  A window's own rate, when it is not the job's, is named as such."""
    from profiler.units import fmt_ms

    if not h.get("steps"):
        return ""
    parts = [f"{h['steps']} steps, {fmt_ms(h['step_ms'])}/step"]
    ips = h.get("images_per_s")
    if ips == ips and ips:
        own = h.get("images_per_s_analysed")
        if own == own and own and own != ips:  # a window: say whose rate is whose
            parts.append(f"{ips:.0f} img/s (the job's; {own:.0f} in the window)")
        elif h.get("window"):  # no job's figure in the trace: the window's alone
            parts.append(f"{ips:.0f} img/s (in the window)")
        else:
            parts.append(f"{ips:.0f} img/s")
    return ", ".join(parts)


BAR_WIDTH = 30


def breakdown_lines(a: Any, width: int = 160) -> list[str]:
    """'Where a step goes': one line per part of the step breakdown, its mean,
    interval, share and a bar (empty without a breakdown), within `width`:
    the bar shrinks (to 8 at least) before an interval would be cut.  A part
    that significant findings draw their cost from ends with their numbers
    ("<- 1, 3"), and a last line sets the findings' costs together against
    the step: the reconciliation of the two on the first screen."""
    from profiler.units import fmt_ms

    bd = getattr(a, "breakdown", None)
    if bd is None or len(bd) == 0:
        return []
    total = float(bd["ms"].sum())
    if not total > 0:
        return []
    label_w = max(len(str(x)) for x in bd["label"])
    steps = a.header.get("steps") or 0
    out = textwrap.wrap(f"Where a step goes (mean of ranks, {steps} steady steps; the parts "
                        "sum to the step):", width=width, subsequent_indent="  ")
    rows = list(bd.itertuples(index=False))
    ivs = [f"[{fmt_ms(r.lo_ms)}, {fmt_ms(r.hi_ms)}]"
           if r.hi_ms - r.lo_ms > 0.01 * max(abs(r.ms), 1e-9) else "" for r in rows]
    claims = a.part_claims() if hasattr(a, "part_claims") else {}
    marks = [("\u2190 " + ", ".join(map(str, claims[r.part]))) if r.part in claims else ""
             for r in rows]
    ivs = [f"{iv} {m}".strip() for iv, m in zip(ivs, marks)]
    fixed = 2 + label_w + 2 + 9 + 1 + 4 + 2 + 1  # the columns around the bar
    bar_w = max(8, min(BAR_WIDTH, width - fixed - max(len(iv) for iv in ivs)))
    for r, iv in zip(rows, ivs):
        share = float(r.ms) / total
        pct = ("<1%" if 0 < share < 0.005 else "0%" if abs(share) < 0.005
               else f"{share:.0%}")
        bar = "\u2588" * int(round(share * bar_w))
        out.append(f"  {str(r.label):<{label_w}}  {fmt_ms(r.ms):>9} {pct:>4}  {bar:<{bar_w}}"
                   f" {iv}".rstrip())
    line = a.reconciliation() if hasattr(a, "reconciliation") else ""
    if line:
        out += textwrap.wrap(line, width=width, subsequent_indent="  ")
    return out


def render(a: Any, *, width: int = 100) -> str:
    """The advice as text a person reads in ten seconds, wrapped to `width`."""
    width = max(60, min(int(width), 160))
    out = textwrap.wrap(header_line(a), width=width, subsequent_indent="  ") + [""]
    parts = breakdown_lines(a, width)
    if parts:
        out += [line if len(line) <= width else line[:width].rstrip() for line in parts] + [""]
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
        if getattr(f, "null", ""):
            out += wrap.wrap("tested against: " + f.null)
        if f.recommendation:
            out += wrap.wrap("try: " + f.recommendation)
        if f.check:
            out += wrap.wrap("check: " + f.check)
        out.append("")
    if not sig:
        out += textwrap.wrap("no significant finding: nothing measured here costs more than "
                             "the run-to-run noise, or passed its test.", width=width) + [""]
    # Three kinds of finding that are not claimed, each under what it is: one
    # that failed its test, one whose cost the noise hides, and one that
    # claims no cost at all (a description, however large the part it
    # describes: a long wait for Horovod's cycle is not noise).
    unclaimed = [f for f in a.minor if getattr(f, "not_claimed", "")]
    minor = [f for f in a.minor if not getattr(f, "not_claimed", "") and f.cost_ms is not None]
    described = [f for f in a.minor if not getattr(f, "not_claimed", "") and f.cost_ms is None]
    if unclaimed:
        out.append("Not claimed:")
        for f in unclaimed:
            out += wrap.wrap(f"{f.headline}; {f.not_claimed}.")
        out.append("")
    if minor:
        out.append("Below the noise floor:")
        for f in minor:
            out += wrap.wrap(f"{f.headline} {_cost(f)}".rstrip())
        out.append("")
    if described:
        out.append("Measured, no cost claimed:")
        for f in described:
            out += wrap.wrap(f.headline + (f": {f.details[0]}" if f.details else ""))
        out.append("")
    if a.limits:
        out.append("Cannot conclude:")
        for f in a.limits:
            out += wrap.wrap(f.headline + (f": {f.details[0]}" if f.details else ""))
    return "\n".join(out).rstrip()
