"""`profiler tensors TRACE`: per-tensor table from the fusion lineage.

    profiler tensors trace.json [--sort bytes|calls|queued|negotiation|wait|fused|name]
                     [--top N] [--op ALLREDUCE] [--format table|csv|json]

TRACE is a trace.json or a profile directory.  The lineage is the
lineage.parquet the merge wrote next to the trace (from the profiler's own
tensor and call records, plus Horovod's timeline when the job wrote one);
when it is missing but the profile directory still holds the ranks'
datasets, this command builds it with the post-job stage (nothing is
written; `profiler merge DIR` writes it).  One row per tensor
and Horovod operation: calls (operations of that tensor), bytes (per
operation), queued (mean and max time from the tensor's enqueue to the start
of the call that carried it: negotiation, waiting for other ranks, the cycle),
negotiation and wait-for-data (only with Horovod's timeline), fused-with (mean
number of other tensors in the same collective call), ambiguous (operations
whose call has more than one tensor set that fits the records: the call shown
is the likeliest by Horovod's order, the json gives every candidate),
unmatched (operations no recorded call explained, or not inferred in the
time budget), and the rank most often last ready (the last to enqueue the
tensor).  The title counts the tensor operations certain, ambiguous and
unmatched.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from profiler.analysis.facade import TraceAnalysis

SORT_KEYS = {
    "bytes": ("total_bytes", False),
    "calls": ("calls", False),
    "queued": ("queued_mean_us", False),
    "negotiation": ("negotiation_mean_us", False),
    "wait": ("wait_mean_us", False),
    "fused": ("fused_with_mean", False),
    "name": ("tensor", True),
}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "tensors", help="per-tensor table: bytes, calls, negotiation, wait-for-data, fusion",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="trace.json or profile directory")
    p.add_argument("--sort", choices=sorted(SORT_KEYS), default="bytes")
    p.add_argument("--top", type=int, metavar="N", help="only the first N rows")
    p.add_argument("--op", metavar="OP", help="only this Horovod operation (ALLREDUCE, ...)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--whatif", action="store_true",
                   help="data calls and transfer time per step at other fusion thresholds "
                        "and cycle times, predicted from this run")
    return p


def load_lineage(path: str) -> Any:
    """The lineage table for a trace.json or profile directory (typed errors)."""
    from profiler.analysis.facade import TraceAnalysis

    return _lineage(TraceAnalysis.open(path, engine="pandas"))


def _lineage(ta: TraceAnalysis) -> Any:
    """The profile's stored lineage, else one the post-job stage builds now from
    the ranks' datasets (nothing written), handed to the analysis; without
    either, the stored lineage's error, which says why."""
    from pathlib import Path

    from profiler.errors import NotFoundError
    from profiler.postjob.lineage import build_lineage

    try:
        return ta.lineage()
    except NotFoundError:
        p = Path(ta.path)
        d = p if p.is_dir() else p.parent
        outcome = build_lineage(d, write=False) if d.is_dir() else None
        if outcome is None or outcome.table is None:
            raise
        ta.use_lineage(outcome.table)
        return outcome.table


def run(args: argparse.Namespace) -> int:
    from profiler.analysis.facade import TraceAnalysis
    from profiler.errors import UsageError

    if args.top is not None and args.top < 1:
        raise UsageError(None, f"--top must be >= 1, not {args.top}")
    ta = TraceAnalysis.open(args.trace, engine="pandas")
    lin = _lineage(ta)
    if args.whatif:
        return _whatif(args, ta)
    table = ta.tensors()
    if args.op:
        known = sorted(set(table["op"]))
        if args.op.upper() not in known:
            raise UsageError(args.trace, f"no {args.op} operations (have: {', '.join(known)})")
        table = table[table["op"] == args.op.upper()]
    col, ascending = SORT_KEYS[args.sort]
    table = table.sort_values([col, "tensor"], ascending=[ascending, True], kind="stable")
    if args.top:
        table = table.head(args.top)
    table = table.reset_index(drop=True)
    if args.format == "json":
        import orjson

        sys.stdout.write(orjson.dumps(table.to_dict(orient="records"),
                                      option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    elif args.format == "csv":
        table.to_csv(sys.stdout, index=False)
    else:
        _print_table(args.trace, table, lin)
    return 0


#: Columns left out first when the terminal is narrow (tensor, op and calls stay).
_DROP_FIRST = ("queued max", "neg max", "wait for data", "last ready", "unmatched",
               "ambiguous", "negotiation", "fused with", "queued", "bytes")


def _print_table(path: str, table: Any, lin: Any) -> None:
    from profiler.units import fmt_bytes, fmt_us

    from ._table import console, fit, rich_table, terminal_width

    width = terminal_width()
    matched = lin.loc[lin["matched"]]
    n_calls = int(matched[["call_comm", "call_seq"]].drop_duplicates().shape[0])
    amb = matched.loc[matched["confidence"] < 1.0, ["call_comm", "call_seq"]]
    n_amb = int(amb.drop_duplicates().shape[0])
    source = "/".join(sorted(set(lin["source"].astype(str)))) if len(lin) else "-"
    title = (f"{path}: {lin['tensor'].nunique()} tensors, {len(lin)} tensor operations, "
             f"{n_calls} collective calls matched ({source}"
             + (f"; {n_amb} ambiguous: see --format json" if n_amb else "") + ")")
    if "certainty" in lin.columns and len(lin):
        cert = lin["certainty"].astype(str).value_counts()
        title += "; operations: " + ", ".join(
            f"{int(cert[k])} {k}" for k in ("certain", "ambiguous", "unmatched", "not inferred")
            if k in cert.index)
    timeline = bool(table["negotiation_mean_us"].notna().any())
    names = ["tensor", "op", "calls", "bytes", "queued", "queued max"]
    if timeline:
        names += ["negotiation", "neg max", "wait for data"]
    names += ["fused with", "ambiguous", "unmatched", "last ready"]
    cols: dict[str, list[str]] = {n: [] for n in names}
    for r in table.itertuples(index=False):
        cells = [str(r.tensor), str(r.op), str(r.calls), fmt_bytes(r.bytes),
                 fmt_us(r.queued_mean_us), fmt_us(r.queued_max_us)]
        if timeline:
            cells += [fmt_us(r.negotiation_mean_us), fmt_us(r.negotiation_max_us),
                      fmt_us(r.wait_mean_us)]
        cells += [f"{r.fused_with_mean:.1f}", str(r.ambiguous) if r.ambiguous else "-",
                  str(r.unmatched) if r.unmatched else "-",
                  "-" if r.last_ready_rank < 0 else f"rank {r.last_ready_rank}"]
        for n, c in zip(names, cells):
            cols[n].append(c)
    shown, hidden = fit(cols, {}, width, _DROP_FIRST)
    out = console(width)
    out.print(rich_table(title, cols, shown, left=("tensor", "op"), width=width), crop=False)
    if hidden:
        out.print(f"(not shown at this width: {', '.join(n for n in names if n in hidden)}; "
                  "--format csv shows every column)", markup=False)


def _whatif(args: argparse.Namespace, ta: TraceAnalysis) -> int:
    """`--whatif`: profiler.analysis.fusion_whatif on this run."""
    import numpy as np

    from profiler.errors import NotFoundError
    from profiler.units import fmt_bytes, fmt_ms

    lin = ta.lineage()
    w = ta.fusion_whatif()
    if w is None:
        ops = set(lin["op"].astype(str)) if len(lin) else set()
        if "ADASUM" in ops and "ALLREDUCE" not in ops:
            # not bad input: the replay prices allreduces; Adasum's data go
            # point to point (MPI_Sendrecv), its MPI_Allreduce carries 3
            # doubles a tensor
            print(f"{args.trace}: no fusion what-if: this run reduces with Adasum (its data "
                  "go by MPI_Sendrecv, which the replay does not price)")
            return 0
        raise NotFoundError(args.trace, "no what-if: the run has no allreduce lineage with "
                                        "readiness (tensor records) or too few allreduce "
                                        "sizes to fit")
    if args.format == "json":
        import orjson

        doc = {k: v for k, v in vars(w).items() if k != "table"}
        doc["table"] = w.table.to_dict(orient="records")
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
        return 0
    if args.format == "csv":
        w.table.to_csv(sys.stdout, index=False)
        return 0
    print(f"{args.trace}: {w.steps} steps at HOROVOD_FUSION_THRESHOLD={fmt_bytes(w.threshold)}, "
          f"HOROVOD_CYCLE_TIME={w.cycle_ms:g} ms")
    what = ("transfer (from the last rank's arrival)" if w.basis == "transfer"
            else "rank 0's call time (one rank read: waits included)")
    # short lines: each reads whole in an 80-column terminal
    print(f"  this run: {w.actual_calls:.1f} data calls/step (predicted {w.base_calls:.1f}, "
          f"error {100 * w.calls_error:.0f}%)")
    print(f"  {what}, median step: {fmt_ms(w.actual_comm_median_ms)}")
    print(f"    predicted {fmt_ms(w.base_comm_ms)}; rank 0 in its data calls "
          f"{fmt_ms(w.actual_wait_ms)}/step with its waits")
    if w.latency is not None:
        print(f"  latency from {w.latency.describe()}")
        print("    prediction error "
              + (f"{100 * w.error:.0f}%" if np.isfinite(w.error) else "unknown"))
        for why in w.distrust():
            print(f"    not trusted: {why}")
    print(f"  {'threshold':>10s} {'cycle':>7s} {'calls/step':>11s} {'transfer/step':>14s}")
    for r in w.table.itertuples(index=False):
        th = fmt_bytes(r.threshold) if r.threshold else "0 (off)"
        print(f"  {th:>10s} {r.cycle_ms:5g} ms {r.calls_per_step:11.1f} "
              f"{fmt_ms(r.transfer_ms_per_step):>14s}" + ("  (this run)" if r.current else ""))
    return 0
