"""`profiler summarize TRACE`: calls, sizes, latency and bandwidth per collective.

    profiler summarize trace.json [--by op,bucket] [--format table|csv|json] [--rank R]

TRACE is a trace.json, a profile directory or a parquet file.  The table shows
data traffic; when the trace classifies calls (kind column), Horovod's control
traffic gets its own line (calls, calls/s per rank, time share).  Sizes that
are not powers of two are marked with *.  A last line compares the slowest
and fastest rank's total communication time.  csv and json hold every
communication call (data and control), one row per group; json is a list of
objects with the grouping keys plus calls, total_bytes, total_us, mean_us,
p50_us, p95_us, p99_us, max_us, algbw_gbps, busbw_gbps, time_share, pow2.
A trace recorded with HOROVOD_PROFILE=summary is summarized from its
aggregates (percentiles then come from log-scale histograms).

Filters: --rank R (repeatable) or --ranks 0-7,12; --steps A-B; --ops a,b.  A
trace with a parquet dataset is queried in place (DuckDB over ranks/*.parquet,
filters pushed down, exact percentiles over every call, bounded memory: see
profiler.analysis.engine); --engine pandas loads it into memory instead, and
--engine dask runs the same query on Dask (--scheduler ADDRESS, else a local
cluster).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from profiler.analysis.facade import Calls, TraceAnalysis

import argparse
import sys
from typing import Any

DEFAULT_BY = "op,bucket"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "summarize", help="per-collective, per-size table of calls, latency and bandwidth",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="trace.json, profile directory or parquet file")
    p.add_argument("--by", action="append", metavar="KEYS",
                   help="grouping keys, comma-separated or repeated: op, bytes, bucket, "
                        f"rank, thread, comm, kind, track, dtype, backend, step "
                        f"(default {DEFAULT_BY})")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--wide", action="store_true",
                   help="every column, however wide the terminal (csv and json always "
                        "hold every column)")
    p.add_argument("--rank", action="append", type=int, metavar="R",
                   help="only rank R (repeatable)")
    p.add_argument("--ranks", default=None, metavar="LIST", help="only these ranks, e.g. 0-7,12")
    p.add_argument("--steps", default=None, metavar="A-B", help="only these steps, e.g. 10-20")
    p.add_argument("--ops", default=None, metavar="LIST", help="only these ops, e.g. allreduce")
    p.add_argument("--engine", choices=("auto", "duckdb", "pandas", "dask"), default="auto",
                   help="auto: DuckDB over the parquet dataset when there is one, else pandas")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="--engine dask: the Dask scheduler (default: a local cluster)")
    return p


def _by_keys(values: list[str] | None) -> list[str]:
    raw = values or [DEFAULT_BY]
    return [k.strip() for v in raw for k in v.split(",") if k.strip()]


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.facade import BY_KEYS
    from profiler.cli._args import parse_names, parse_span
    from profiler.errors import UsageError
    from profiler.layout import parse_ranges

    by = _by_keys(args.by)
    for k in by:
        if k not in BY_KEYS:
            raise UsageError(None, f"--by: unknown key {k!r} (choose from "
                                   f"{', '.join(BY_KEYS)})")
    if len(set(by)) != len(by):
        raise UsageError(None, f"--by lists a key twice: {', '.join(by)}")
    ranks = list(args.rank or [])
    if args.ranks:
        ranks += parse_ranges(args.ranks)
    ranks_arg = sorted(set(ranks)) if ranks else None
    steps = parse_span(args.steps) if args.steps else None
    ops = parse_names(args.ops) if args.ops else None
    from profiler.analysis.facade import TraceAnalysis

    ta = TraceAnalysis.open(args.trace, engine=args.engine, scheduler=args.scheduler)
    calls = ta.calls(by=by, ranks=ranks_arg, steps=steps, ops=ops)
    if args.format == "json":
        import orjson

        rows = _printable(calls.table(by)).to_dict(orient="records")
        sys.stdout.buffer.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2
                                             | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        return 0
    if args.format == "csv":
        _printable(calls.table(by)).to_csv(sys.stdout, index=False)
        return 0
    _print_table(ta, calls, by, wide=args.wide)
    return 0


def _clock_line(meta: dict[str, Any]) -> str | None:
    """How well the ranks' clocks line up, when they are not one clock: the offsets'
    error bounds (half the best round trip) and the drift between MPI_Init and
    MPI_Finalize.  None for one host (offset 0 exactly)."""
    ranks = [r for r in meta.get("ranks") or []
             if (r.get("offset_method") or 0) > 0 and r.get("rank") != 0]
    if not ranks:
        return None
    errs = [max(int(r.get("offset_err_ns") or 0), int(r.get("offset_end_err_ns") or 0))
            for r in ranks]
    drifts = [abs(float(r["clock_drift_ppm"])) for r in ranks
              if r.get("clock_drift_ppm") is not None]
    line = (f"clock offsets: {len(ranks)} rank(s) aligned to rank 0 within "
            f"{_fmt_us(max(errs) / 1e3)}")
    if drifts and max(drifts) > 0:
        line += f", drift up to {max(drifts):.2f} ppm (corrected linearly)"
    elif drifts:
        line += ", no drift beyond the bounds"
    return line


def _printable(df: Any) -> Any:
    """A copy of the table with its names escaped: the pandas path gets them escaped
    when read (dataset.table_to_frame), the DuckDB path straight from the files,
    which another tool may have written."""
    from profiler.formats.dataset import printable_columns

    return printable_columns(df.copy())


def _ranks_text(ranks: list[int]) -> str:
    from profiler.layout import format_ranges

    return format_ranges(ranks) or "none"


def _fmt_us(v: float) -> str:
    from profiler.units import fmt_us

    return fmt_us(v)


def _fmt_bw(v: float) -> str:
    from profiler.units import fmt_bw

    return fmt_bw(v)


def _print_table(ta: TraceAnalysis, calls: Calls, by: list[str], *,
                 wide: bool = False) -> None:
    """The terminal summary: the table of data traffic, then one line each for
    control traffic, per-rank time, what the trace lacks, clocks and GPUs."""
    from ._table import console as make_console
    from ._table import terminal_width

    path, meta = ta.path, ta.meta
    # A terminal gets the columns that fit its width, every cell whole; a pipe
    # or a file (or --wide) gets every column.
    width = terminal_width(wide)
    console = make_console(width)
    data_kinds = None
    has_control = p2p_apart = False
    if calls.has_kind and "kind" not in by:
        kinds = calls.kinds()
        has_control = "control" in kinds
        rest = [k for k in kinds if k not in ("control", "p2p")]
        # point-to-point gets its own lines, unless it is all there is
        p2p_apart = "p2p" in kinds and bool(rest)
        if has_control or p2p_apart:
            data_kinds = rest if p2p_apart else [k for k in kinds if k != "control"]
    table_df = _printable(calls.table(by, data_kinds))
    n_ranks = len(calls.ranks())
    world = (meta or {}).get("world_size", n_ranks)
    title = f"{path}: {n_ranks} rank(s)" + (f" of {world}" if world != n_ranks else "")
    if data_kinds is not None:
        title += " - data traffic"
    if calls.aggregated:
        title += " (summary mode)"
    table, irregular, hidden = _rich_table(title, table_df, by, width)
    console.print(table, crop=False)
    if hidden:
        console.print(f"(not shown at this width: {', '.join(hidden)}; --wide or "
                      "--format csv shows every column)")
    if irregular:
        console.print("* sizes that are not powers of two")
    if calls.aggregated:
        console.print("percentiles estimated from log-scale latency histograms "
                      "(summary mode)")
    lines: list[str | None] = []
    if has_control:
        lines.append(_control_line(calls, n_ranks))
    if p2p_apart:
        lines += _p2p_lines(ta, calls)
    lines.append(_rank_line(calls))
    lines += _trace_lines(ta)
    lines += calls.gpu_lines(meta)
    lines += _finding_lines(ta, calls)
    for line in lines:
        if line:
            console.print(line, markup=False)


def _finding_lines(ta: TraceAnalysis, calls: Calls) -> list[str]:
    """The top findings (analysis.findings, as `profiler advise` ranks them), one
    line each; nothing for summary-mode traces, or a line saying why not."""
    if calls.aggregated:
        return []
    import warnings

    from profiler.errors import ProfilerError, printable
    from profiler.units import fmt_ms

    try:
        with warnings.catch_warnings():  # what loading says was said above
            warnings.simplefilter("ignore")
            advice = ta.advise()
    except ProfilerError as exc:
        return [printable(f"findings: none drawn ({exc.line()})")]
    from .advise import step_figures_text

    steps = step_figures_text(advice.header)
    out = [f"steady steps: {steps}"] if steps else []
    top = advice.significant[:3]
    if not top:
        return [*out, "findings: no significant finding (profiler advise TRACE for details)"]
    out.append("findings (profiler advise TRACE for details):")
    for n, f in enumerate(top, 1):
        cost = f" [{fmt_ms(f.cost_ms)}/step]" if f.cost_ms is not None else ""
        out.append(printable(f"  {n}. {f.headline}{cost}"))
    # what particular ranks did, whatever its rank among the findings
    for f in advice.significant[3:]:
        if f.key in RANK_NOTES:
            cost = f" [{fmt_ms(f.cost_ms)}/step]" if f.cost_ms is not None else ""
            out.append(printable(f"  also: {f.headline}{cost}"))
    return out


#: Findings about what particular ranks did (a rank waiting in hvd.join), shown
#: by summarize also when they are not among the top three.
RANK_NOTES = ("uneven_data",)


# Metric columns, most important first: at a narrow width the last are left out.
_METRIC_COLUMNS = ("calls", "bytes", "total", "p50", "p99", "share", "busbw GB/s", "mean",
                   "p95", "max", "algbw GB/s")


def _rich_table(title: str, table_df: Any, by: list[str],
                width: int | None) -> tuple[Any, bool, list[str]]:
    """The summary table as a rich Table with the columns that fit `width` (None:
    all); every cell whole.  Returns (table, a size is not a power of two, the
    names of the columns left out)."""
    from profiler.units import fmt_bw, fmt_bytes, fmt_us

    from ._table import fit, rich_table

    irregular = False
    cols: dict[str, list[str]] = {k: [] for k in by}
    cols.update({m: [] for m in _METRIC_COLUMNS})
    for row in table_df.itertuples(index=False):
        r = row._asdict()
        for k in by:
            v = r[k]
            if k == "bytes":
                text = f"{int(v)}"
                if not r["pow2"] and int(v) > 0:
                    text += " *"
                    irregular = True
            elif k == "bucket":
                text = str(v) + (" *" if not r["pow2"] else "")
                irregular |= not r["pow2"]
            else:
                text = str(v)
            cols[k].append(text)
        for name, text in (("calls", f"{r['calls']}"), ("bytes", fmt_bytes(r["total_bytes"])),
                           ("total", fmt_us(r["total_us"])), ("mean", fmt_us(r["mean_us"])),
                           ("p50", fmt_us(r["p50_us"])), ("p95", fmt_us(r["p95_us"])),
                           ("p99", fmt_us(r["p99_us"])), ("max", fmt_us(r["max_us"])),
                           ("algbw GB/s", fmt_bw(r["algbw_gbps"])),
                           ("busbw GB/s", fmt_bw(r["busbw_gbps"])),
                           ("share", f"{100 * r['time_share']:.1f}%")):
            cols[name].append(text)

    headers = {"bytes": "total bytes"} if "bytes" in by else {}
    droppable = [m for m in reversed(_METRIC_COLUMNS) if m not in ("calls",)]
    shown, hidden = fit(cols, headers, width, droppable)
    left = [n for n in by if n not in ("bytes", "rank", "track", "step")]
    t = rich_table(title, cols, shown, headers=headers, left=left, width=width)
    return t, irregular, sorted(hidden, key=_METRIC_COLUMNS.index)


def _control_line(calls: Calls, n_ranks: int) -> str:
    """Horovod's control traffic: calls, rate per rank, time and share."""
    total_ns = calls.time_ns()
    n_ctrl = calls.count("control")
    ctrl_ns = calls.time_ns("control")
    share = ctrl_ns / total_ns if total_ns else 0.0
    rate = ""
    if not calls.aggregated:
        span_ns = calls.span_ns()
        if span_ns > 0:
            per_s = n_ctrl / (span_ns / 1e9) / max(1, n_ranks)
            rate = f" ({per_s:.1f} calls/s per rank)"
    return (f"control traffic: {n_ctrl} calls{rate}, {_fmt_us(ctrl_ns / 1e3)}, "
            f"{100 * share:.1f}% of communication time")


def _p2p_lines(ta: TraceAnalysis, calls: Calls) -> list[str]:
    """MPI point-to-point traffic: calls, time and share; then the messages
    matched across ranks (profiler.analysis.p2p: bytes, transfer time, what
    was left unmatched), when the trace has per-call rows."""
    total_ns = calls.time_ns()
    n = calls.count("p2p")
    t_ns = calls.time_ns("p2p")
    share = t_ns / total_ns if total_ns else 0.0
    out = [f"point-to-point: {n} calls, {_fmt_us(t_ns / 1e3)}, {100 * share:.1f}% of "
           "communication time"]
    if calls.aggregated:
        return out
    from profiler.errors import ProfilerError
    from profiler.units import fmt_bytes

    try:
        s = ta.p2p_summary()
    except ProfilerError as exc:
        out.append(f"  messages not matched ({exc.line()})")
        return out
    line = f"  {s['matched']} messages matched ({fmt_bytes(s['bytes'])})"
    if s["transfer_p50_ns"] is not None:
        line += f", transfer p50 {_fmt_us(s['transfer_p50_ns'] / 1e3)}"
    left = [f"{s[k]} {w}" for k, w in (("unmatched_sends", "send(s)"),
                                        ("unmatched_recvs", "receive(s)")) if s[k]]
    out.append(line)
    if left:
        out.append(f"  unmatched: {', '.join(left)}")
    return out


def _rank_line(calls: Calls) -> str | None:
    """Slowest and fastest rank's communication time (Calls.rank_imbalance)."""
    im = calls.rank_imbalance()
    if im is None:
        return None
    if im["ranks"] == 1:
        return (f"communication time: {_fmt_us(im['slowest_us'])} on rank "
                f"{im['slowest_rank']}")
    if im["spread_us"] == 0:
        return (f"per-rank communication time: {_fmt_us(im['slowest_us'])} on "
                f"each of {im['ranks']} ranks")
    ratio = f"{im['ratio']:.2f}x" if im["fastest_us"] > 0 else "inf"
    return (f"per-rank communication time: slowest rank {im['slowest_rank']} "
            f"{_fmt_us(im['slowest_us'])}, fastest rank {im['fastest_rank']} "
            f"{_fmt_us(im['fastest_us'])} ({ratio})")


def _trace_lines(ta: TraceAnalysis) -> list[str]:
    """What the trace lacks or qualifies: missing, partial and dropping ranks,
    clock alignment, what marked the steps, the interconnect and the
    profiler's cost, an event window."""
    meta = ta.meta
    if not meta:
        return []
    out = []
    if meta.get("missing_ranks"):
        out.append(f"missing ranks: {_ranks_text(meta['missing_ranks'])}")
    if meta.get("partial_ranks"):
        out.append(f"partial ranks (killed before the end): "
                   f"{_ranks_text(meta['partial_ranks'])}")
    dropped = {int(r.get("rank", -1)): int(r.get("dropped") or 0)
               for r in meta.get("ranks") or [] if isinstance(r, dict)}
    lost = {r: n for r, n in dropped.items() if n > 0}
    if lost:
        out.append(f"dropped records: {sum(lost.values())} calls not recorded (ranks "
                   f"{_ranks_text(sorted(lost))}: the raw file could not grow); the "
                   "statistics above miss them")
    clock = _clock_line(meta)
    if clock:
        out.append(clock)
    if meta.get("steps_marked_by"):
        out.append("steps marked by: " + "; ".join(map(str, meta["steps_marked_by"])))
    out += ta.notes()
    ev = meta.get("events") or {}
    if ev.get("selection", "all") != "all":
        out.append(f"note: trace.json holds {ev.get('included')} of "
                   f"{ev.get('total')} calls; this summary reads the full dataset")
    return out
