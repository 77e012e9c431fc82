"""`profiler compare A B [C ...]`: differences between traces, and whether they exceed
run-to-run noise.

    profiler compare fused/trace.json unfused/trace.json [--labels fused,unfused]
                     [--baseline fused] [--format table|json]

Each trace is compared with the baseline (the first unless --baseline names
one) on per-step metrics (step time, images/sec, communication and exposed
communication per step, calls and bytes per step; when the traces mark steps),
the share of steps that waited a whole Horovod cycle more than the fast ones
(where either trace shows that second peak: advise's second_cycles), and per
power-of-two size bucket (calls, mean and p99 latency of data calls).
A difference is significant (*) when its 95% bootstrap interval excludes 0
(steps, or calls, are the resampled units; Welch's p for per-step means).
Labels default to the traces' directory names.  json: a list of objects with
label, baseline, metric, bucket, value, baseline_value, diff, rel_diff, ci_low,
ci_high, p_value, significant, n, n_baseline.

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
    p.add_argument("traces", nargs="+", help="trace.json files or profile directories")
    p.add_argument("--labels", default=None, help="comma-separated, one per trace")
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

    if len(args.traces) < 2:
        raise UsageError(None, "compare needs at least two traces")
    labels = None
    if args.labels:
        labels = [x.strip() for x in args.labels.split(",")]
        if len(labels) != len(args.traces) or len(set(labels)) != len(labels):
            raise UsageError(None, f"--labels: give {len(args.traces)} distinct labels")
    if args.max_rows < 0:
        raise UsageError(None, "--max-rows must be >= 0")
    ranks = parse_ranges(args.ranks) if args.ranks else None
    steps = parse_span(args.steps) if args.steps else None
    first, *others = [TraceAnalysis.open(t, engine="pandas") for t in args.traces]
    cmp = first.compare(*others, labels=labels, baseline=args.baseline, warmup=args.warmup,
                        ranks=ranks, steps=steps, max_rows=args.max_rows or None)
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
        steps = part.loc[part["bucket"] == "", "n"]
        if len(steps) and int(steps.min()) < 10:
            console.print(f"note: run-to-run noise estimated from only {int(steps.min())} "
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


def _row_text(name: str, r: Any) -> str:
    rel = ("" if isinstance(r.rel_diff, float) and math.isnan(r.rel_diff)
           else f" ({r.rel_diff:+.1%}")
    ci = ("" if isinstance(r.ci_low, float) and math.isnan(r.ci_low)
          else f", 95% CI of the difference [{_fmt(r.ci_low, r.metric)}, "
               f"{_fmt(r.ci_high, r.metric)}]")
    verdict = ("significant" if r.significant is True
               else "within run-to-run noise")
    return (f"  {name}: {_fmt(r.value, r.metric)} vs {_fmt(r.baseline_value, r.metric)}"
            f"{rel}{ci}{')' if rel else ''}: {verdict}")


def _share_text(name: str, r: Any) -> str:
    """A share of steps: its difference in percentage points, not relative."""
    def pts(v: float) -> str:
        return f"{v * 100:+.0f}"

    ci = ("" if isinstance(r.ci_low, float) and math.isnan(r.ci_low)
          else f", 95% CI [{pts(r.ci_low)}, {pts(r.ci_high)}]")
    verdict = "significant" if r.significant is True else "within run-to-run noise"
    return (f"  {name}: {r.value:.0%} vs {r.baseline_value:.0%} ({pts(r.diff)} points{ci}; "
            f"each on its own HOROVOD_CYCLE_TIME): {verdict}")


def _verdict(label: str, base: str, part: Any) -> list[str]:
    """Images/sec and step time with their intervals first, then the few other
    differences larger than the noise (largest first)."""
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
    sig = part.loc[(part["significant"] == True)  # noqa: E712 - the column holds None too
                   & ~part["metric"].isin([m for m, _ in _VERDICT_METRICS])]
    if len(sig):
        sig = sig.assign(_size=sig["rel_diff"].abs()).sort_values("_size", ascending=False)
        out.append(f"  {len(sig)} other difference(s) beyond the noise"
                   + (f", the {SHOWN} largest:" if len(sig) > SHOWN else ":"))
        from profiler.units import fmt_bytes

        for r in sig.head(SHOWN).itertuples(index=False):
            where = f" at \u2264 {fmt_bytes(int(r.bucket))}" if r.bucket else ""
            out.append(printable(_row_text(f"{r.metric}{where}", r)).replace("  ", "    ", 1))
    else:
        out.append("  no other difference beyond the run-to-run noise")
    return out


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
                     _fmt(r.p_value), "*" if r.significant is True else ""])
    keep = list(range(len(names)))

    def need(cols: list[int]) -> int:
        return sum(max([len(names[c])] + [len(row[c]) for row in rows]) + 3
                   for c in cols) + 1

    for drop in (6, 7, 4):  # CI, p, diff
        if width is not None and need(keep) > width:
            keep.remove(drop)
    t = Table(title=Text(printable(f"{label} vs {base}")), title_justify="left")
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
