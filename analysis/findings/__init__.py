"""Findings: answers with their cost.  One analyzer per question, each a module
with `analyze(ctx) -> list[Finding]`:

* step_time: whether communication limits the job at all (compute_bound);
* late_ranks: which rank the others wait for (tested against chance), and the
  waiting no rank causes (rank_waiting);
* slow_link: one host's link slower than the others' (3+ hosts), from the
  kernel's tcp_info on the job's own connections, priced as the step with
  that link as fast as the others;
* horovod_cycle: the time tensors wait for Horovod's cycle (cycle_time when
  HOROVOD_CYCLE_TIME is longer than the default, else horovod_wait), and the
  steps that wait a whole cycle more than the fast ones (second_cycles:
  step times in peaks a cycle apart, tested against one spread);
* cpu_contention: threads of the job waiting for a CPU (schedstat), the job's
  own doing; noisy_neighbour: processes outside the job busy on its CPUs
  (/proc/stat and /proc/<pid>/stat, the merge's cpu_hosts), named;
  cpu_quota: a rank throttled by its cgroup's CPU quota (cpu.stat), named
  with the quota; cpuset: a rank whose cgroup cpuset holds fewer CPUs than
  its busy threads;
* uneven_data: ranks waiting in hvd.join for a rank with more batches (the
  time in join, apart from the steps the ranks share);
* control_plane: Horovod's negotiation and response-cache traffic;
* latency_cliffs: message sizes far above the curve of the others (the fit
  without the size, a larger size's time, the smaller sizes' time per byte),
  the largest included, claimed only once a replay of those sizes alone and
  of sizes bracketing them confirms them (`advise --confirm`);
* fusion: another HOROVOD_FUSION_THRESHOLD, replayed from the run's fusion
  lineage (analysis.fusion_whatif), recommended only above its own error;
* efficiency: transfers against what the fabric delivers (a bench trace of
  the same fabric, or the run's own fastest transfers);
* horovod_settings: tuning variables Horovod read otherwise than a person
  would (HOROVOD_FUSION_THRESHOLD=64MB is 64 bytes to Horovod);
* limits: what the trace cannot support (dropped records, no steps, clocks,
  NCCL invisible, summary mode, no lineage).

Every finding with a cost draws it from one part of the step breakdown
(analysis.breakdown: compute, waiting for other ranks, waiting for Horovod,
transfer, profiler, unexplained, which sum to the step) and says what it was
tested against (Finding.null).

`advise(path)` opens a trace, runs them all and ranks the findings by cost
(ms per step, the lower end of the interval first); the CLI (`profiler
advise`), `profiler summarize`'s last lines, the report and the notebooks use
these same findings, and the breakdown (Advice.breakdown) opens them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import (
    cliffs,
    contention,
    control,
    cycle,
    efficiency,
    elastic,
    fusion,
    join,
    late_ranks,
    limits,
    links,
    settings,
    step_time,
)
from .base import Context, Finding

__all__ = ["Finding", "Context", "Advice", "ANALYZERS", "advise", "advise_frame", "context_of",
           "COLUMNS"]

ANALYZERS = {
    "step_time": step_time.analyze,
    "late_ranks": late_ranks.analyze,
    "slow_link": links.analyze,
    "horovod_cycle": cycle.analyze,
    "cpu_contention": contention.analyze,
    "noisy_neighbour": contention.analyze_neighbour,
    "cpu_quota": contention.analyze_quota,
    "cpuset": contention.analyze_cpuset,
    "uneven_data": join.analyze,
    "control_plane": control.analyze,
    "latency_cliffs": cliffs.analyze,
    "efficiency": efficiency.analyze,
    "fusion": fusion.analyze,
    "horovod_settings": settings.analyze,
    "limits": limits.analyze,
    "elastic": elastic.analyze,
}

#: What the analyzers read: load() asks for these columns only.
COLUMNS = ["rank", "backend", "op", "t_start_ns", "t_end_ns", "dur_ns", "bytes", "count",
           "comm", "comm_size", "seq", "kind", "step", "device", "thread_kind", "track"]
MAX_ROWS = 2_000_000


@dataclass
class Advice:
    """The findings of one trace, ranked: significant findings by cost, then the
    others, then the limits."""

    path: str
    header: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    #: the job's step breakdown (analysis.breakdown.breakdown_summary: part,
    #: label, ms, lo_ms, hi_ms, share), empty without steps
    breakdown: Any = None

    @property
    def significant(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == "finding" and f.significant]

    @property
    def minor(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == "finding" and not f.significant]

    @property
    def limits(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == "limit"]

    @property
    def causes(self) -> list[tuple[int, Finding]]:
        """The significant findings that name a cause (not a part of the step
        described, SYMPTOMS), with their numbers in rank order (1-based)."""
        return [(n, f) for n, f in enumerate(self.significant, 1)
                if f.key not in SYMPTOMS and f.cost_ms is not None]

    @property
    def claimed_ms(self) -> float:
        """The causes' costs together: at most the step (_within_the_step)."""
        return float(sum(f.cost_ms or 0.0 for _, f in self.causes))

    def reconciliation(self) -> str:
        """The causes' costs set against the step, one sentence ("" without a
        step time or a cause): what the first screen says under the breakdown
        (`profiler advise`, the report)."""
        from profiler.units import fmt_ms

        step = self.header.get("step_ms")
        causes = self.causes
        if not causes or not isinstance(step, float) or not step > 0:
            return ""
        got = self.claimed_ms
        nums = ", ".join(str(n) for n, _ in causes)
        return (f"The causes found ({nums}) claim {fmt_ms(got)} of the {fmt_ms(step)} step "
                f"({got / step:.0%}): each is the step without its cause, and together they "
                f"claim at most the step; {fmt_ms(max(step - got, 0.0))} no cause found "
                "explains.")

    def part_claims(self) -> dict[str, list[int]]:
        """Per breakdown part, the numbers (1-based, in rank order) of the
        significant findings whose cost is drawn from it."""
        out: dict[str, list[int]] = {}
        for n, f in enumerate(self.significant, 1):
            if f.part and f.cost_ms is not None:
                out.setdefault(f.part, []).append(n)
        return out

    def table(self) -> Any:
        """The findings as a DataFrame (one row each: key, kind, headline, cost,
        interval, significant, recommendation), for notebooks and the report."""
        import pandas as pd

        return pd.DataFrame([{
            "key": f.key, "kind": f.kind, "headline": f.headline, "cost_ms": f.cost_ms,
            "cost_lo_ms": f.cost_interval_ms[0] if f.cost_interval_ms else None,
            "cost_hi_ms": f.cost_interval_ms[1] if f.cost_interval_ms else None,
            "significant": f.significant, "recommendation": f.recommendation,
        } for f in self.findings], columns=["key", "kind", "headline", "cost_ms",
                                            "cost_lo_ms", "cost_hi_ms", "significant",
                                            "recommendation"])

    def to_dict(self) -> dict[str, Any]:
        bd = self.breakdown
        parts = ([] if bd is None or len(bd) == 0 else
                 [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                  for r in bd.to_dict(orient="records")])
        step = self.header.get("step_ms")
        claimed = ({"claimed_ms": self.claimed_ms, "step_ms": step,
                    "unexplained_ms": step - self.claimed_ms}
                   if isinstance(step, float) and step == step else None)
        return {"trace": self.path, **self.header, "breakdown": parts,
                "reconciliation": claimed,
                "findings": [f.to_dict() for f in self.findings]}


#: Findings that describe a part of the step rather than a cause in it: their
#: cost is what remains of the part once the significant causes drawn from the
#: same part are taken out, so that nothing is counted twice (compute that
#: waited for a core is the contention's, not the model's), and so a cause
#: ranks above the symptom it explains.
SYMPTOMS = {"transfer_bound": "transfer", "compute_bound": "compute"}


def _less(f: Finding, taken: float, ctx: Context) -> None:
    """The finding's cost and interval less `taken` ms (never below 0), its
    img/s and its significance with them."""
    cost = float(f.cost_ms or 0.0)
    lo, hi = f.cost_interval_ms or (cost, cost)
    f.cost_ms = max(cost - taken, 0.0)
    f.cost_interval_ms = (max(lo - taken, 0.0), max(hi - taken, 0.0))
    f.cost_img_s = ctx.cost_img_s(f.cost_ms)
    f.significant = ctx.significant(f.cost_interval_ms[0])


def _residual(found: list[Finding], ctx: Context) -> None:
    for f in found:
        part = SYMPTOMS.get(f.key)
        if part is None or f.cost_ms is None or not f.significant:
            continue
        causes = [c for c in found if c is not f and c.significant and c.part == part
                  and c.cost_ms is not None and c.key not in SYMPTOMS]
        taken = sum(float(c.cost_ms or 0.0) for c in causes)
        if taken <= 0:
            continue
        _less(f, taken, ctx)
        f.details.append("beyond what " + ", ".join(c.key for c in causes)
                         + " explains of this part.")
        f.headline += " (the rest, beyond the causes found)"


def _efficiency(ctx: Context, bench: Context | None, found: list[Finding]) -> list[Finding]:
    """One wait, one cause: the calls at the sizes a confirmed latency cliff
    explains (latency_cliffs runs first) are slow by their size, which that
    finding claims with its remedy; the efficiency finding judges the other
    transfers only, and says so."""
    sizes = frozenset(int(b) for f in found if f.key == "latency_cliffs" and f.significant
                      for b in f.numbers.get("confirmed") or [])
    out = efficiency.analyze(ctx, bench, exclude=sizes)
    if sizes:
        for f in out:
            if f.key == "efficiency":
                f.numbers["left_out_bytes"] = sorted(sizes)
                f.details.append("the calls at the sizes on a latency cliff (latency_cliffs) "
                                 "are left out: slow by their size, which that finding claims.")
    return out


def _late_beyond_its_neighbour(found: list[Finding], ctx: Context) -> None:
    """One wait, one cause: a rank that arrives last because a noisy
    neighbour holds its core, or its cgroup's CPU quota throttles it, or its
    cpuset is narrower than its threads, is late by that wait, which the
    cause's finding already claims (its cost: the step without that wait).
    The late-rank claim keeps only the rest, and is claimed only if the
    rest clears the noise floor."""
    from profiler.units import fmt_ms

    what = {"noisy_neighbour": "the neighbour's wait", "cpu_quota": "its CPU quota's throttling",
            "cpuset": "its narrow cpuset's wait"}
    for nb in (f for f in found if f.key in what and f.significant
               and f.cost_ms is not None):
        for f in found:
            if not (f.key == "late_ranks" and f.significant and f.cost_ms is not None
                    and f.numbers.get("rank") in (nb.numbers.get("ranks") or [])):
                continue
            taken = float(nb.cost_ms or 0.0)
            f.numbers[f"cost_with_{nb.key}_ms"] = float(f.cost_ms)
            if nb.key == "noisy_neighbour":
                f.numbers["cost_with_neighbour_ms"] = float(f.cost_ms)
            _less(f, taken, ctx)
            f.details.append(
                f"{fmt_ms(taken)} of its lateness is {what[nb.key]}, claimed by {nb.key}; the "
                f"cost above is the rest, {fmt_ms(f.cost_ms)} per step.")


def _carried_share(ctx: Context, rank: int) -> float:
    """Of a rank's lateness at synchronize (its arrival against the others'
    median, the median over steps), the share it carried in from the step
    before: it began the step late by that much (it left the previous
    synchronize last, its transfer ending after the others').  0 to 1."""
    bd = ctx.breakdown
    if bd.empty or "t_start_ns" not in bd.columns:
        return 0.0
    r = bd.loc[bd["arrival_ns"] >= 0, ["step", "rank", "t_start_ns", "arrival_ns"]]
    late, carried = [], []
    for _, g in r.groupby("step"):
        if rank not in set(g["rank"]) or len(g) < 2:
            continue
        me = g.loc[g["rank"] == rank].iloc[0]
        others = g.loc[g["rank"] != rank]
        late.append(float(me["arrival_ns"] - others["arrival_ns"].median()))
        carried.append(float(me["t_start_ns"] - others["t_start_ns"].median()))
    if len(late) < 3:
        return 0.0
    lat = float(np.median(late))
    if lat <= 0:
        return 0.0
    return float(min(max(float(np.median(carried)) / lat, 0.0), 1.0))


def _late_beyond_the_link(found: list[Finding], ctx: Context) -> None:
    """One wait, one cause: where a slow link is claimed, a rank that arrives
    late because it began the step late (its previous transfer, over that
    link, ended after the others') carries the link's time, which slow_link
    prices (the step with the link as fast as the others).  The late-rank
    claim keeps only the lateness the rank made itself (its compute and
    start-up after the previous step: _carried_share's rest)."""
    from profiler.units import fmt_ms

    link = next((f for f in found if f.key == "slow_link" and f.significant
                 and f.cost_ms is not None), None)
    if link is None:
        return
    for f in found:
        rank = f.numbers.get("rank")
        if not (f.key == "late_ranks" and f.significant and f.cost_ms is not None
                and isinstance(rank, (int, np.integer))):
            continue
        share = _carried_share(ctx, int(rank))
        if share <= 0:
            continue
        taken = float(f.cost_ms) * share
        f.numbers["cost_with_link_ms"] = float(f.cost_ms)
        f.numbers["carried_share"] = share
        _less(f, taken, ctx)
        f.details.append(
            f"it began its steps late: {share:.0%} of its lateness it carried in from the step "
            f"before, whose transfer over {link.numbers.get('host')}'s slow link ended last on "
            f"it (slow_link claims that time); the cost above is the rest, {fmt_ms(f.cost_ms)} "
            "per step.")


def _at_the_cycle_edge(found: list[Finding]) -> None:
    """A job whose steps sit at Horovod's cycle edge (second_cycles passed
    its test) answers a change in its step by whole cycles: what another
    finding's remedy saves shows as steps that stop missing the cycle, a
    cycle each, or not at all, not as the milliseconds priced.  Said beside
    each claimed remedy, with the figure that shows it (compare's
    second_cycle_share)."""
    edge = next((f for f in found if f.key == "second_cycles" and f.cost_ms is not None),
                None)  # the claimed form: the test against its null passed
    share = edge.numbers.get("share") if edge is not None else None
    cycle = edge.numbers.get("cycle_time_ms") if edge is not None else None
    if not isinstance(share, (int, float)) or not isinstance(cycle, (int, float)):
        return
    for f in found:
        if f is edge or not (f.significant and f.recommendation and f.cost_ms):
            continue
        f.details.append(
            f"this job's steps sit at Horovod's cycle edge ({share:.0%} wait a whole "
            f"{cycle:g} ms cycle more: second_cycles): a step's time moves by whole cycles, "
            "so this saving shows as fewer steps a cycle late, a cycle each, rather than as "
            "its own length; profiler compare BEFORE AFTER gives both (the step time and "
            "second_cycle_share).")


def _within_the_step(found: list[Finding], ctx: Context) -> None:
    """The claimed costs, taken together, never exceed the step.  Each is a
    counterfactual on its own (the step without that cause), and two causes
    can explain the same time (a late rank's lateness and the contention that
    made it late): taken in rank order, a claim is at most what the claims
    above it leave of the step, and says so.  `found` is ranked."""
    from profiler.units import fmt_ms

    step = ctx.step_ms
    if not (step == step and step > 0):
        return
    left = step
    for f in found:
        if not (f.kind == "finding" and f.significant and f.cost_ms is not None
                and f.key not in SYMPTOMS):  # a symptom is the rest of its part
            continue
        cost = float(f.cost_ms)
        if cost > left:
            lo, hi = f.cost_interval_ms or (cost, cost)
            f.cost_ms = max(left, 0.0)
            f.cost_interval_ms = (min(lo, f.cost_ms), min(hi, f.cost_ms))
            f.cost_img_s = ctx.cost_img_s(f.cost_ms)
            f.numbers["cost_alone_ms"] = cost
            f.details.append(
                f"{fmt_ms(cost)} per step on its own, but the findings ranked above already "
                f"claim all but {fmt_ms(f.cost_ms)} of the {fmt_ms(step)} step: their causes "
                "overlap, and together no claims exceed the step.")
            f.significant = ctx.significant(f.cost_interval_ms[0])
        left -= float(f.cost_ms)


def _rank_key(f: Finding) -> tuple[int, float]:
    order = 0 if f.kind == "finding" and f.significant else 1 if f.kind == "finding" else 2
    lo = f.cost_interval_ms[0] if f.cost_interval_ms else (f.cost_ms or 0.0)
    return order, -(lo if lo == lo else 0.0)


def _header(ctx: Context) -> dict[str, Any]:
    from ..interconnect import interconnect

    world = ctx.meta.get("world_size")
    ranks = world if isinstance(world, int) and world >= len(ctx.ranks) else len(ctx.ranks)
    return {"ranks": ranks, "ranks_analysed": len(ctx.ranks),
            "window": bool(ctx.df.attrs.get("selection")), "hosts": len(ctx.hosts) or 1,
            "interconnect": interconnect(ctx.meta) or "",
            "steps": ctx.n_steps, "step_ms": ctx.step_ms,
            # the whole job's rate (a window's own is its ranks' share of it)
            "images_per_s": ctx.job_images_per_s, "images_per_s_analysed": ctx.images_per_s,
            "job_step_ms": ctx.job_step_ms}


def advise_frame(df: Any, meta: dict[str, Any] | None = None, *, path: str = "",
                 only: Sequence[str] | None = None, bench: Context | None = None,
                 replay: Context | None = None) -> Advice:
    """Run the analyzers on a loaded frame (one trace) and rank the findings;
    `bench`: a bench trace of the same fabric, for the efficiency finding, the
    transfer_bound finding and the fusion what-if's latency; `replay`: a replay of the run's flagged
    message sizes alone (`advise --confirm`), which confirms or dismisses the
    latency cliffs."""
    if "label" in df.columns:  # one trace of a multi-trace frame: the label is constant
        df = df.drop(columns=["label"])
    ctx = Context(df=df, meta=dict(meta or {}), path=path)
    found: list[Finding] = []
    for name, fn in ANALYZERS.items():
        if only is not None and name not in only:
            continue
        if name == "efficiency":
            found.extend(_efficiency(ctx, bench, found))
            continue
        if name == "latency_cliffs" and (replay is not None or bench is not None):
            found.extend(cliffs.analyze(ctx, replay=replay, bench=bench))
            continue
        if name == "step_time" and bench is not None:
            found.extend(step_time.analyze(ctx, bench))
            continue
        if name == "fusion" and bench is not None:
            found.extend(fusion.analyze(ctx, bench=bench))
            continue
        found.extend(fn(ctx))
    _residual(found, ctx)
    _late_beyond_its_neighbour(found, ctx)
    _late_beyond_the_link(found, ctx)
    _at_the_cycle_edge(found)
    found.sort(key=_rank_key)
    _within_the_step(found, ctx)
    found.sort(key=_rank_key)
    return Advice(path=path, header=_header(ctx), findings=found, breakdown=ctx.parts)


def _open(path: str | os.PathLike[str], max_rows: int) -> tuple[Any, dict[str, Any]]:
    from ..load import load, trace_meta

    return load(path, columns=COLUMNS, max_rows=max_rows), trace_meta(path) or {}


def context_of(path: str | os.PathLike[str] | None, max_rows: int = MAX_ROWS
               ) -> Context | None:
    """Another profile (a bench or replay trace) opened as a Context, None for
    None."""
    if path is None:
        return None
    df, meta = _open(path, max_rows)
    return Context(df=df, meta=meta, path=os.fspath(path))


def advise(path: str | os.PathLike[str], *, only: Sequence[str] | None = None,
           max_rows: int = MAX_ROWS, bench: str | os.PathLike[str] | None = None,
           replay: str | os.PathLike[str] | None = None) -> Advice:
    """Open a trace (trace.json, profile directory or parquet file), load what the
    analyzers read (a bounded window above `max_rows` calls) and advise;
    `bench`: a `profiler bench` trace of the same fabric (hosts, ranks,
    transport), the reference of the efficiency and transfer_bound findings
    and the fusion what-if's latency; `replay`: a trace of the run's flagged sizes replayed
    alone (profiler.bench.confirm), which confirms or dismisses latency cliffs."""
    df, meta = _open(path, max_rows)
    return advise_frame(df, meta, path=os.fspath(path), only=only,
                        bench=context_of(bench, max_rows), replay=context_of(replay, max_rows))
