"""`profiler compare A B [C ...]`: differences between traces, and whether they exceed
the run-to-run variation.

    profiler compare fused/trace.json unfused/trace.json [--labels fused,unfused]
                     [--baseline fused] [--format table|json]
    profiler compare on-1 on-2 on-3 --vs off-1 off-2 off-3 [--paired]
                     [--labels on,off]

Each trace (or, with --vs, each side: the traces before --vs, then each --vs
group, the repeated runs of one configuration) is compared with the baseline
(the first unless --baseline names one) on per-step metrics (step time,
images/sec, communication and exposed communication per step, calls and bytes
per step; when the traces mark steps), the share of steps that waited a whole
Horovod cycle more than the fast ones (where either trace shows that second
peak: advise's second_cycles), and per power-of-two size bucket (calls, mean
and p99 latency of data calls).

Two runs of one configuration differ by more than their steps' spread (the
machine drifts), so only repetitions can call a difference significant (*):
with 2+ runs a side, Welch's t over the runs' values (or, with --paired, for
runs that alternated A B A B ..., a paired t over the pairs' differences) and
its 95% interval, significant when that excludes 0.  With one run a side the
95% bootstrap interval over its steps (or calls) is shown, but it measures
within-run noise only: a difference inside it is within the noise, one outside
it gets no verdict (run-to-run variation unknown).  Labels default to the
traces' directory names (with --vs, what the side's names share).  json: a
list of objects with label, baseline, metric, bucket, value, baseline_value,
diff, rel_diff, ci_low, ci_high, p_value, significant (true, false or null),
n, n_baseline, test (within-run, welch-runs, paired-runs or ""), reason, runs,
runs_baseline.

Big traces: --ranks and --steps are pushed down to the parquet scans; a trace
whose dataset holds more than --max-rows rows (divided among the traces;
default 10000000) is compared on a window of it (its first ranks, its likely
stragglers, its middle steps), and the table says so.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

DEFAULT_MAX_ROWS = 10_000_000


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "compare", help="compare traces (per step and per size bucket) against noise",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", help="trace.json files or profile directories "
                   "(with --vs: the runs of the first side)")
    p.add_argument("--vs", action="append", nargs="+", default=None, metavar="TRACE",
                   help="the runs of another side (repeatable: one side each)")
    p.add_argument("--paired", action="store_true",
                   help="the sides' runs alternated (A B A B ...): run i of each side is "
                        "paired with run i of the others (paired t-test)")
    p.add_argument("--labels", default=None,
                   help="comma-separated, one per trace (with --vs: one per side)")
    p.add_argument("--baseline", default=None, help="label to compare against (default: first)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--all", action="store_true",
                   help="the full table of every metric and size bucket after the verdict")
    p.add_argument("--warmup", type=int, default=1, help="steps left out at the start (1)")
    p.add_argument("--ranks", default=None, metavar="LIST", help="only these ranks, e.g. 0-7")
    p.add_argument("--steps", default=None, metavar="A-B", help="only these steps, e.g. 10-50")
    p.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, metavar="N",
                   help="rows loaded at most, all traces together (0: no bound)")
    return p


def _fmt(v: Any, metric: str = "") -> str:
    from profiler.units import fmt_bytes, fmt_number

    if metric.endswith("_share") and isinstance(v, float) and math.isfinite(v):
        return f"{v:.0%}"
    return fmt_bytes(v) if metric.endswith("bytes_per_step") else fmt_number(v)


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.facade import TraceAnalysis
    from profiler.cli._args import parse_span
    from profiler.errors import UsageError
    from profiler.layout import parse_ranges

    groups = [list(args.traces), *(args.vs or [])]
    if args.vs is None and len(args.traces) < 2:
        raise UsageError(None, "compare needs at least two traces (or runs of two sides: "
                               "A1 A2 --vs B1 B2)")
    names = None
    if args.labels:
        names = [x.strip() for x in args.labels.split(",")]
        want = len(groups) if args.vs is not None else len(args.traces)
        if len(names) != want or len(set(names)) != len(names) or not all(names):
            raise UsageError(None, f"--labels: give {want} distinct labels"
                                   + (" (one per side)" if args.vs is not None else ""))
    if args.max_rows < 0:
        raise UsageError(None, "--max-rows must be >= 0")
    ranks = parse_ranges(args.ranks) if args.ranks else None
    steps = parse_span(args.steps) if args.steps else None
    labels: list[str] | None = names
    runs: dict[str, list[str]] | None = None
    if args.vs is not None:  # sides of runs: each run labelled side#i
        sides = names or _side_names(groups)
        runs = {side: [side if len(g) == 1 else f"{side}#{i}" for i in range(1, len(g) + 1)]
                for side, g in zip(sides, groups)}
        labels = [x for v in runs.values() for x in v]
        if len(set(labels)) != len(labels):
            raise UsageError(None, "--labels: a side's label clashes with another's runs "
                                   "(side#i); choose other labels")
    elif args.paired:
        raise UsageError(None, "--paired: give the runs of each side (A1 A2 --vs B1 B2)")
    first, *others = [TraceAnalysis.open(t, engine="pandas") for g in groups for t in g]
    baseline = args.baseline
    cmp = first.compare(*others, labels=labels, baseline=baseline, warmup=args.warmup,
                        ranks=ranks, steps=steps, max_rows=args.max_rows or None, runs=runs,
                        paired=args.paired)
    table, windows = cmp.table, cmp.windows
    if args.format == "json":
        import orjson

        rows = table.to_dict(orient="records")
        sys.stdout.buffer.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2 |
                                             orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        for label, w in windows.items():
            print(f"profiler: note: {label or 'the trace'}: compared on a window of "
                  f"{w['rows']} of {w['rows_total']} rows (--max-rows)", file=sys.stderr)
        return 0
    import shutil

    from rich.console import Console

    tty = sys.stdout.isatty()
    width = shutil.get_terminal_size((120, 24)).columns if tty else 120
    console = Console(highlight=False, soft_wrap=False, width=width if tty else 10_000)
    for label, part in table.groupby("label", sort=False):
        base = str(part["baseline"].iloc[0])
        for line in _verdict(str(label), base, part):
            console.print(line, markup=False, highlight=False)
        if args.all:
            console.print(_full_table(str(label), base, part, width if tty else None),
                          crop=False)
        steps = part.loc[(part["bucket"] == "") & (part["test"] == "within-run"), "n"]
        if len(steps) and int(steps.min()) < 10:
            console.print(f"note: within-run noise estimated from only {int(steps.min())} "
                          "step(s); intervals are rough below 10 steps", style="yellow")
    if not args.all and not table.empty:
        console.print("(--all: every metric and size bucket)")
    if table.empty:
        console.print("no comparable calls or steps")
    for label, w in windows.items():
        console.print(f"note: {label or 'the trace'}: compared on a window of {w['rows']:,} "
                      f"of {w['rows_total']:,} rows (ranks "
                      f"{_ranks_text(w['ranks'])}{_steps_text(w['steps'])}; --max-rows)",
                      style="yellow")
    return 0


_VERDICT_METRICS = (("images_per_s", "images/sec"), ("step_ms", "step time (ms)"),
                    ("second_cycle_share", "steps a whole Horovod cycle late"))
SHOWN = 5


_RUN_TESTS = {"welch-runs": "Welch's t over the runs' values",
              "paired-runs": "paired t over the alternating runs' differences"}


def _p_text(p: float) -> str:
    return "p < 0.001" if p < 1e-3 else f"p = {p:.2g}"


def _judgement(r: Any) -> str:
    """The row's verdict in words: significant only from repeated runs."""
    if r.significant is True:
        return "significant"
    if r.significant is False:
        return ("within the run-to-run spread" if r.test in _RUN_TESTS
                else "within the within-run noise")
    return f"no verdict, {r.reason}" if r.reason else "no verdict"


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _row_text(name: str, r: Any) -> str:
    rel = "" if _nan(r.rel_diff) else f" ({r.rel_diff:+.1%}"
    ci = ("" if _nan(r.ci_low)
          else f", {'within-run ' if r.test == 'within-run' else ''}95% CI of the difference "
               f"[{_fmt(r.ci_low, r.metric)}, {_fmt(r.ci_high, r.metric)}]")
    p = f", {_p_text(r.p_value)}" if r.test in _RUN_TESTS and not _nan(r.p_value) else ""
    return (f"  {name}: {_fmt(r.value, r.metric)} vs {_fmt(r.baseline_value, r.metric)}"
            f"{rel}{ci}{p}{')' if rel else ''}: {_judgement(r)}")


def _share_text(name: str, r: Any) -> str:
    """A share of steps: its difference in percentage points, not relative."""
    def pts(v: float) -> str:
        return f"{v * 100:+.0f}"

    ci = ("" if _nan(r.ci_low)
          else f", {'within-run ' if r.test == 'within-run' else ''}95% CI "
               f"[{pts(r.ci_low)}, {pts(r.ci_high)}]")
    return (f"  {name}: {r.value:.0%} vs {r.baseline_value:.0%} ({pts(r.diff)} points{ci}; "
            f"each on its own HOROVOD_CYCLE_TIME): {_judgement(r)}")


def _basis(label: str, base: str, part: Any) -> str:
    """Which test the verdicts come from, in one line."""
    from profiler.errors import printable

    tests = [t for t in _RUN_TESTS if (part["test"] == t).any()]
    runs = int(part["runs"].max()) if len(part) else 0
    runs_b = int(part["runs_baseline"].max()) if len(part) else 0
    if tests:
        return printable(f"  test: {_RUN_TESTS[tests[0]]} ({runs} runs of {label}, {runs_b} of "
                         f"{base}), 95% intervals; significant when the interval excludes 0")
    if runs <= 1 and runs_b <= 1:
        return ("  one run per side: the intervals measure the noise within a run only, and "
                "run-to-run variation is unknown, so no difference is called significant; "
                "repeat each side for a verdict (A1 A2 A3 --vs B1 B2 B3)")
    return ("  fewer than 2 runs on a side: run-to-run variation unknown, so no difference is "
            "called significant (intervals: within-run)")


def _verdict(label: str, base: str, part: Any) -> list[str]:
    """Images/sec and step time with their intervals first, then the few other
    differences beyond the noise (largest first), then the test they come from."""
    from profiler.errors import printable

    out = [printable(f"{label} vs {base}:")]
    steps = part.loc[part["bucket"] == ""]
    for metric, name in _VERDICT_METRICS:
        rows = steps.loc[steps["metric"] == metric]
        if not len(rows):
            continue
        r = next(rows.itertuples(index=False))
        if metric == "images_per_s" and not r.value and not r.baseline_value:
            # steps with no batch size: "0 vs 0, within the noise" would read as a verdict
            out.append("  images/sec: not recorded (the steps carry no batch size; "
                       "HOROVOD_PROFILE_BATCH_SIZE=N gives each step its images)")
            continue
        out.append(_share_text(name, r) if metric.endswith("_share") else _row_text(name, r))
    if len(out) == 1:
        out.append("  no steps recorded in both traces: no images/sec or step-time verdict")
    others = ~part["metric"].isin([m for m, _ in _VERDICT_METRICS])
    by_runs = part["test"].isin(list(_RUN_TESTS)).any()
    if by_runs:
        sig = part.loc[(part["significant"] == True) & others]  # noqa: E712 - None too
        where = "beyond the run-to-run spread"
    else:  # outside the within-run noise: the candidates a repetition would test
        sig = part.loc[part["significant"].isna() & (part["test"] == "within-run") & others]
        where = "outside the within-run noise (no verdict: run-to-run variation unknown)"
    if len(sig):
        sig = sig.assign(_size=sig["rel_diff"].abs()).sort_values("_size", ascending=False)
        out.append(f"  {len(sig)} other difference(s) {where}"
                   + (f", the {SHOWN} largest:" if len(sig) > SHOWN else ":"))
        from profiler.units import fmt_bytes

        for r in sig.head(SHOWN).itertuples(index=False):
            at = f" at \u2264 {fmt_bytes(int(r.bucket))}" if r.bucket else ""
            out.append(printable(_row_text(f"{r.metric}{at}", r)).replace("  ", "    ", 1))
    else:
        out.append(f"  no other difference {where.split(' (')[0]}")
    out.append(_basis(label, base, part))
    return out


def _side_names(groups: list[list[str]]) -> list[str]:
    """A side's default label: what its traces' default labels share (fusion-on-1,
    fusion-on-2 -> fusion-on), else A, B, C ..."""
    import os

    from profiler.analysis.facade import default_label

    names = []
    for g in groups:
        common = os.path.commonprefix([default_label(t) for t in g]).rstrip("-_.#0123456789 ")
        names.append(common)
    if not all(names) or len(set(names)) != len(names):
        names = [chr(ord("A") + i) if i < 26 else f"side{i + 1}" for i in range(len(groups))]
    return names


def _full_table(label: str, base: str, part: Any, width: int | None) -> Any:
    """Every metric and bucket; at a narrow width the CI and p columns go first."""
    from rich.table import Table
    from rich.text import Text

    from profiler.errors import printable
    from profiler.units import fmt_bytes

    names = ["metric", "bucket", label, base, "diff", "rel", "95% CI of diff", "p", ""]
    rows = []
    for r in part.itertuples(index=False):
        bucket = f"\u2264 {fmt_bytes(int(r.bucket))}" if r.bucket else ""
        ci = (f"[{_fmt(r.ci_low, r.metric)}, {_fmt(r.ci_high, r.metric)}]"
              if not (isinstance(r.ci_low, float) and math.isnan(r.ci_low)) else "-")
        rel = ("-" if isinstance(r.rel_diff, float) and math.isnan(r.rel_diff)
               else f"{r.rel_diff:+.1%}")
        rows.append([str(r.metric), bucket, _fmt(r.value, r.metric),
                     _fmt(r.baseline_value, r.metric), _fmt(r.diff, r.metric), rel, ci,
                     _fmt(r.p_value),
                     "*" if r.significant is True else "?" if r.significant is None
                     and r.test == "within-run" else ""])
    keep = list(range(len(names)))

    def need(cols: list[int]) -> int:
        return sum(max([len(names[c])] + [len(row[c]) for row in rows]) + 3
                   for c in cols) + 1

    for drop in (6, 7, 4):  # CI, p, diff
        if width is not None and need(keep) > width:
            keep.remove(drop)
    t = Table(title=Text(printable(f"{label} vs {base} (* significant; ? outside the within-run "
                                   "noise, run-to-run variation unknown)")),
              title_justify="left")
    for c in keep:
        t.add_column(printable(names[c]), justify="left" if c in (0, 8) else "right",
                     no_wrap=width is None, overflow="fold")
    for row in rows:
        t.add_row(*(Text(printable(row[c])) for c in keep))
    return t


def _ranks_text(ranks: list[int]) -> str:
    from profiler.layout import format_ranges

    return format_ranges(ranks)


def _steps_text(steps: list[int] | None) -> str:
    return f", steps {steps[0]}-{steps[1]}" if steps else ""
