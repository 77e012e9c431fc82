"""Waiting between ranks: whether one rank makes the others wait, and what the
waiting costs when none does.

The evidence is the step breakdown's arrivals (analysis.breakdown): per step,
the time each rank handed its last tensor to Horovod (or entered its last
blocking collective).  The rank that arrives last holds every other rank in
synchronize.  Two findings come from the breakdown's ``wait_ranks`` part:

* ``late_ranks``: a rank is named only when it is last significantly more often
  than chance (1/n of the steps, binomial test, Bonferroni over the job's
  ranks, the steps' autocorrelation accounted for: analysis.stats).  Up to
  MAX_LATE ranks are tested (the most often last and the costliest), each a
  finding of its own.  Its cost is a counterfactual: how much sooner each
  step would end if the rank arrived without its systematic excess (the
  median of its arrival beyond the others') and without what it adds beyond
  the jitter every rank shows in the steps where it is late (a rank of many
  that is late in some steps only), every rank's jitter left in place.  The
  others' waiting it causes (averaged over the ranks like the breakdown) is
  given beside it, and is what the rest of the waiting (below) is reckoned
  without.
* ``rank_waiting``: the rest of the waiting, which no rank causes
  consistently: step times that vary on every rank (contention, OS noise,
  data loading, uneven batches).  It names no rank.

Without steps, matched collectives (analysis.imbalance) stand in: the last
arrival at each call, tested against chance the same way.

In a window of a larger job (analysis.load: the first ranks and the ranks one
pass over every call found late), chance is 1/n of the ranks in the window and
the correction is over all the job's ranks: the window's late ranks were
chosen among them.  That pass's ranking is given beside each late rank.

A claim needs clocks aligned better than the lateness it reports.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from profiler.layout import format_ranges
from profiler.units import fmt_ms, fmt_share

from .. import remedies
from ..stats import ALPHA, ChanceTest, chance_test, most_often
from .base import MIN_STEPS, Context, Finding, bootstrap_mean
from .contention import NAMED_SHARE, cpu_waits, main_split, rank_neighbour

NULL = ("chance: with n ranks whose step times vary alike, each is last in 1/n of the steps "
        "(binomial test, p < 0.01 after correcting for the job's ranks and for runs of "
        "steps)")


def clock_error_ms(meta: dict) -> float:
    """The largest clock-offset error bound among the ranks (ms; 0 on one host)."""
    worst = 0
    for r in meta.get("ranks") or []:
        if isinstance(r, dict) and (r.get("offset_method") or 0) > 0:
            worst = max(worst, int(r.get("offset_err_ns") or 0),
                        int(r.get("offset_end_err_ns") or 0))
    return worst / 1e6


def _slow_transfers(df: pd.DataFrame, rank: int) -> bool:
    """The rank's median data-call duration exceeds every other rank's by half."""
    from .._frame import calls

    c = calls(df, kinds=["data"], columns=["rank", "dur_ns"])
    if c.empty or c["rank"].nunique() < 2:
        return False
    med = c.groupby("rank")["dur_ns"].median()
    others = med.drop(index=rank, errors="ignore")
    return bool(len(others) and med.get(rank, 0) > 1.5 * float(others.max()))


def _variation(bd: pd.DataFrame) -> tuple[float, float]:
    """How much each rank's time to arrival varies from step to step (the mean
    over ranks of its standard deviation, ms) and how alike the ranks vary (the
    mean correlation of their arrival offsets across steps; 0: independently)."""
    off = bd.assign(off=(bd["arrival_ns"] - bd["t_start_ns"]) / 1e6)
    off = off.loc[bd["arrival_ns"] >= 0]
    table = off.pivot_table(index="step", columns="rank", values="off").dropna()
    if len(table) < 3 or table.shape[1] < 2:
        return float("nan"), float("nan")
    sd = float(table.std(ddof=1).mean())
    c = table.corr().to_numpy()
    iu = np.triu_indices_from(c, k=1)
    corr = float(np.nanmean(c[iu])) if iu[0].size else float("nan")
    return sd, corr


def _cpu_order(table: pd.DataFrame, lr: pd.DataFrame) -> tuple[int, int] | None:
    """Steps where the last rank's main thread waited longest for a CPU in that
    step (of cpu_waits' table), and the steps compared."""
    if table.empty:
        return None
    lr = lr.loc[lr["step"].isin(table.index) & ~lr["tie"]]
    if lr.empty:
        return None
    most = table.loc[lr["step"].to_numpy()].idxmax(axis=1).to_numpy()
    return int((most == lr["last_rank"].to_numpy()).sum()), len(lr)


def _cpu_excess_ms(table: pd.DataFrame, rank: int, steps: pd.Series) -> float | None:
    """How much longer per step the rank's main thread waited for a CPU than the
    other ranks' on average, over the given steps (None without "cpu" rows)."""
    t = table.loc[table.index.isin(steps)]
    if t.empty or rank not in t.columns or t.shape[1] < 2:
        return None
    return float(t[rank].mean() - t.drop(columns=[rank]).mean(axis=1).mean())


def _more(ms: float) -> str:
    return f"{fmt_ms(ms)} more" if ms >= 0 else f"{fmt_ms(-ms)} less"


def job_ranks(ctx: Context, n: int) -> int:
    """The job's ranks (at least the n of the rows analysed): what a late rank
    was chosen among, so what the test against chance corrects for."""
    meta = ctx.meta or {}
    listed = len(meta.get("ranks") or [])
    world = meta.get("world_size")
    return max(n, listed, int(world) if isinstance(world, (int, float)) else 0)


def tested(winners: np.ndarray, rank: int, n: int, job_n: int) -> ChanceTest | None:
    """`rank` last more often than 1/n of the trials (the n ranks in the rows),
    Bonferroni-corrected over the job's `job_n` ranks (a window's late ranks
    were chosen among all of them)."""
    t = chance_test(winners, rank, n)
    if t is None or job_n <= n:
        return t
    p = min(1.0, t.p_value * job_n / n)
    return replace(t, p_value=p, significant=p < ALPHA)


def _arrival_table(bd: pd.DataFrame, lr: pd.DataFrame) -> pd.DataFrame:
    """The arrivals of last_ranks' steps: rows step, columns rank, ms after the
    step's first arrival (relative: ns since the epoch lose precision as floats)."""
    r = bd.loc[(bd["arrival_ns"] >= 0) & bd["step"].isin(lr["step"]),
               ["step", "rank", "arrival_ns"]]
    rel = r["arrival_ns"] - r.groupby("step")["arrival_ns"].transform("min")
    return (r.assign(t=rel.astype(np.float64) / 1e6)
            .pivot_table(index="step", columns="rank", values="t", aggfunc="max")
            .reindex(lr["step"].to_numpy()))


#: Above this many ranks, a rank's offset is taken against the median of all
#: the ranks (itself included) rather than of the others: the same within one
#: order statistic, without a median per rank.
EXACT_OTHERS = 32


def _offsets(table: pd.DataFrame) -> pd.DataFrame:
    """Each rank's arrival minus the median of the others' in the same step (ms)."""
    if table.shape[1] > EXACT_OTHERS:
        return table.sub(table.median(axis=1), axis=0)
    return pd.DataFrame({r: table[r] - table.drop(columns=[r]).median(axis=1)
                         for r in table.columns}, index=table.index)


@dataclass
class Lateness:
    """A rank's counterfactual (see `lateness`)."""

    gains: np.ndarray  # ms per step (of last_ranks) sooner without its lateness
    excess_ms: float  # its systematic excess: median arrival beyond the others'
    beyond_ms: np.ndarray  # per step: what it adds beyond the others' jitter
    jitter_ms: float  # the others' largest deviation from their own usual offset


def lateness(table: pd.DataFrame, offsets: pd.DataFrame, rank: int) -> Lateness:
    """How much sooner each step would end without `rank`'s lateness.

    Its arrivals move earlier by its systematic excess E (the median over steps
    of its offset beyond the others', at least 0: breakdown.counterfactual_gain's)
    and, in each step, by what its deviation from its own usual offset exceeds
    the jitter every rank shows (J: the median over the other ranks of each one's
    largest deviation from its usual offset).  A rank late by the same amount
    every step loses E; a rank of many late in some steps only (its median
    offset is the others') loses those steps' lateness beyond J; the jitter is
    left in place either way.  Each step's last arrival is recomputed; the tail
    after it (the final transfers) is assumed unchanged."""
    steps = len(table)
    if rank not in table.columns or table.shape[1] < 2:
        return Lateness(np.zeros(steps), 0.0, np.zeros(steps), 0.0)
    dev = offsets - offsets.median(axis=0)
    d = offsets[rank].to_numpy(dtype=np.float64)
    mid = float(np.nanmedian(d)) if np.isfinite(d).any() else 0.0
    excess = max(mid, 0.0)
    spread = dev.drop(columns=[rank]).max(axis=0)
    jitter = float(np.nanmedian(spread.to_numpy(dtype=np.float64))) if len(spread) else 0.0
    jitter = max(jitter, 0.0) if np.isfinite(jitter) else 0.0
    beyond = np.nan_to_num(np.maximum(d - mid - jitter, 0.0))
    moved = table.copy()
    moved[rank] = table[rank] - excess - beyond
    gains = (table.max(axis=1) - moved.max(axis=1)).clip(lower=0.0).fillna(0.0)
    return Lateness(gains.to_numpy(dtype=np.float64), excess, beyond, jitter)


def _candidates(lr: pd.DataFrame, first: int) -> list[int]:
    """The ranks to test: the most often last, then the costliest (the sum of
    their leads when last), MAX_LATE of them at most besides the first."""
    lead = lr.loc[~lr["tie"]].groupby("last_rank")["lead_ms"].sum()
    lead = lead.sort_values(ascending=False, kind="stable")
    out = [first]
    for r in lead.index[:MAX_LATE]:
        if int(r) not in out:
            out.append(int(r))
    return out


def _from_breakdown(ctx: Context) -> list[Finding] | None:
    from ..breakdown import caused_wait, last_ranks

    bd = ctx.breakdown
    if bd.empty:
        return None
    lr = last_ranks(bd)
    if len(lr) < MIN_STEPS:
        return None
    n = int(lr["ranks"].max())
    job_n = job_ranks(ctx, n)
    winners = lr.loc[~lr["tie"], "last_rank"].to_numpy()
    first = most_often(winners, n)
    if first is None:
        return None
    per_step_wait = bd.groupby("step")["wait_ranks_ms"].mean().reindex(lr["step"]).to_numpy()
    caused = np.zeros(len(lr))
    err = clock_error_ms(ctx.meta)
    table = _arrival_table(bd, lr)
    offsets = _offsets(table)
    late: list[tuple[Finding, np.ndarray]] = []
    tests: list[ChanceTest] = []
    for rank in _candidates(lr, first.candidate):
        test = tested(winners, rank, n, job_n)
        if test is None:
            continue
        tests.append(test)
        if test.significant:
            mine = caused_wait(bd, rank)
            late.append((_late_finding(ctx, bd, lr, test, mine,
                                       lateness(table, offsets, rank), err), mine))
    late = sorted(late, key=lambda fc: -(fc[0].cost_ms or 0.0))[:MAX_LATE]
    for _, mine in late:
        caused = caused + mine
    rest = np.maximum(per_step_wait - caused, 0.0)
    named = [int(f.numbers["rank"]) for f, _ in late]
    head = tests[0] if tests else first
    return [*(f for f, _ in late), _waiting_finding(ctx, bd, lr, head, rest, named=named)]


def _late_finding(ctx: Context, bd: pd.DataFrame, lr: pd.DataFrame, test: ChanceTest,
                  caused: np.ndarray, cf: Lateness, err: float) -> Finding:
    late = test.candidate
    gains, excess_ms = cf.gains, cf.excess_ms
    beyond = float(np.mean(cf.beyond_ms)) if len(cf.beyond_ms) else 0.0
    mean, lo, hi = bootstrap_mean(gains)  # the headline: the counterfactual step
    waited = float(np.mean(caused)) if len(caused) else 0.0
    mine = lr.loc[(lr["last_rank"] == late) & ~lr["tie"], "lead_ms"]
    lead = float(mine.median()) if len(mine) else 0.0
    whole_lead = float(mine.sum()) / len(lr) if len(lr) else 0.0
    source = str(bd["source"].mode().iloc[0]) if len(bd) else ""
    sync = remedies.sync_name(remedies.framework(ctx.meta))
    where = ("it hands its gradients to Horovod later than the others (its data loading, "
             f"forward or backward pass takes longer); the others wait in {sync}"
             if source == "sync" else
             "it enters the step's collectives after the others; they wait in them")
    details = [f"{where}.",
               f"last in {test.describe()}; it trails the next rank by "
               f"{fmt_ms(lead)} on median when last, {fmt_ms(excess_ms)} beyond the "
               "others' arrivals on median over all steps.",
               (f"without that excess, its arrivals {fmt_ms(excess_ms)} earlier and every "
                "rank's jitter as it was," if beyond < 0.5 * max(excess_ms, 1e-12) else
                f"without that excess and what it adds beyond the {fmt_ms(cf.jitter_ms)} "
                f"every rank's arrival varies by ({fmt_ms(beyond)} per step on average, "
                f"in the {int((cf.beyond_ms > 0).sum())} steps it was late), every rank's "
                "jitter as it was,")
               + f" each step would end {fmt_ms(mean)} sooner on "
               f"average (the cost above); the others wait {fmt_ms(waited)} per step for it, "
               "averaged over all ranks like the breakdown."]
    # where the late rank's extra time outside synchronize went, against the
    # others' in the same steps: waiting for a core is the scheduler's, not its
    # work; more time on a CPU is more work or a slower core; neither is time
    # blocked (I/O, a lock, a sleep).  A part that covers half the lateness
    # is named as its cause, else the figures are given as they are.  Only
    # where the others wait in synchronize (its CPU figures are taken out):
    # waiting in a blocking collective, an MPI library polls, on a CPU.
    split = main_split(ctx)
    parts = ("wait", "run", "blocked") if source == "sync" else ("wait",)
    got = {part: _cpu_excess_ms(split[part], late, lr["step"]) for part in parts}
    excess = got["wait"]
    ex = {part: v for part, v in got.items() if v is not None}  # all, or none
    cause = next((part for part in parts
                  if lead > 0 and part in ex and ex[part] >= 0.5 * lead), None)
    by_cpu = cause == "wait"
    if len(ex) == 1 and ex["wait"] > 0:
        details.append(f"its compute thread waited {fmt_ms(ex['wait'])} per step longer for "
                       "a CPU than the others'" + (": most of its lateness is waiting for a "
                                                   "core, not more work." if by_cpu else "."))
    elif len(ex) == 3:
        details.append(
            f"outside {sync} its compute thread spent, per step, {_more(ex['run'])} "
            f"than the others' running on a CPU, {_more(ex['wait'])} waiting for one and "
            f"{_more(ex['blocked'])} blocked (neither)"
            + {"wait": ": most of its lateness is waiting for a core, not more work.",
               "run": ": most of its lateness is more CPU time for the step, that is more "
                      "work (its data, another code path) or a slower core (its clock, a "
                      "busy hyper-thread sibling, a virtual machine's stolen time).",
               "blocked": ": most of its lateness is time blocked, neither computing nor "
                          "waiting for a core (I/O, data loading, a lock, a sleep).",
               None: "."}[cause])
    significant = ctx.significant(lo)
    conf = f"95% interval over {len(lr)} steps"
    if err > 0 and err >= 0.5 * max(lead, 1e-9):
        significant = False
        details.append(f"clocks are aligned within {fmt_ms(err)}, not enough to order "
                       f"arrivals {fmt_ms(lead)} apart: not a conclusion.")
        conf = "clocks too uncertain"
    return Finding(
        key="late_ranks",
        headline=f"Rank {late} arrives last in {fmt_share(test.share)} of steps",
        details=details, cost_ms=mean, cost_interval_ms=(lo, hi),
        cost_img_s=ctx.cost_img_s(mean), confidence=conf,
        recommendation=("" if not significant else
                        f"give rank {late}'s threads cores of their own (see the CPU "
                        "contention finding): fewer threads per rank, binding, no other "
                        "busy processes on its cores" if by_cpu else
                        f"find what rank {late} computes more, or what slows its cores: its "
                        "data, its CPU placement (mpirun --bind-to core, then move it), the "
                        "cores' clocks, what else runs on them" if cause == "run" else
                        f"find what rank {late} waits on outside the step's work: its data "
                        "loading and I/O (storage, loader workers), locks, sleeps"
                        if cause == "blocked" else
                        f"find what rank {late} does differently (its data, its host's load, "
                        "its CPU placement, other processes on its cores)"),
        check="profiler summarize TRACE --by rank; profiler compare BEFORE AFTER",
        numbers={"rank": late, "last_share": test.share, "last_count": test.count,
                 "steps": test.trials, "p_value": test.p_value, "n_eff": test.n_eff,
                 "lateness_ms": lead, "excess_ms": excess_ms, "step_gain_ms": mean,
                 "beyond_jitter_ms_per_step": beyond, "jitter_ms": cf.jitter_ms,
                 "whole_lead_ms_per_step": whole_lead, "others_wait_ms_per_step": waited,
                 "source": source, "clock_error_ms": err,
                 "cpu_excess_ms": excess, "late_by_cpu": by_cpu,
                 "run_excess_ms": got.get("run"), "blocked_excess_ms": got.get("blocked"),
                 "late_by": cause},
        significant=significant, part="wait_ranks", null=NULL,
    )


def _waiting_finding(ctx: Context, bd: pd.DataFrame, lr: pd.DataFrame, test: ChanceTest,
                     rest: np.ndarray, *, named: list[int]) -> Finding:
    mean, lo, hi = bootstrap_mean(rest)
    sd, corr = _variation(bd)
    counts = lr.loc[~lr["tie"], "last_rank"].value_counts()
    n = int(lr["ranks"].max())
    if named:
        order = ("besides " + " and ".join(f"rank {r}'s" for r in named)
                 + " lateness (above)")
    elif n == 2:
        order = ("; ".join(f"rank {int(r)} last in {int(c)} of {len(lr)} steps"
                           for r, c in counts.sort_index().items())
                 + f": what chance gives ({test.describe()})")
    else:
        order = (f"no rank is last more often than chance: the most often, rank "
                 f"{test.candidate}, in {test.describe()}")
    details = [order + "."]
    if np.isfinite(sd):
        alike = ("independently" if not np.isfinite(corr) or abs(corr) < 0.3 else
                 f"together (correlation {corr:.2f})")
        sync = remedies.sync_name(remedies.framework(ctx.meta))
        details.append(f"each rank's time to reach {sync} varies by ±{fmt_ms(sd)} from "
                       f"step to step, {alike}: the step waits for the slowest of them.")
    cpu = _cpu_order(cpu_waits(ctx), lr)
    if cpu is not None and cpu[1] >= MIN_STEPS:
        details.append(f"the last rank's main thread had waited longest for a CPU in "
                       f"{cpu[0]} of {cpu[1]} steps (chance {1 / n:.0%}).")
    significant = ctx.significant(lo)
    head = ("Ranks wait {} per step for each other; no rank is consistently last"
            if not named else "Ranks also wait {} per step for each other beyond that")
    return Finding(
        key="rank_waiting",
        headline=head.format(fmt_ms(mean)),
        details=details, cost_ms=mean, cost_interval_ms=(lo, hi),
        cost_img_s=ctx.cost_img_s(mean),
        confidence=f"95% interval over {len(lr)} steps",
        recommendation=("make step times steadier on every rank: CPU contention (threads per "
                        "rank, binding), OS noise, data loading, uneven batch sizes; no rank "
                        "is to blame" if significant else ""),
        check="profiler summarize TRACE --by rank; profiler compare BEFORE AFTER",
        numbers={"wait_ms": mean, "variation_ms": sd, "rank_correlation": corr,
                 "last_counts": {int(r): int(c) for r, c in counts.items()},
                 "p_value": test.p_value},
        significant=significant, part="wait_ranks", null=NULL,
    )


#: At most this many late ranks are named at once (each tested on its own).
MAX_LATE = 3


def _from_matched(ctx: Context) -> list[Finding]:
    """Without a step breakdown: the last arrival at each matched collective.
    The candidates are the ranks whose lateness costs most (the sum of their
    leads when last), each tested against chance: two late ranks are two
    findings, each priced on its own calls (a rank last by a microsecond more
    often than chance is not the one the job waits for)."""
    m = ctx.matched
    if m.empty:
        return []
    has = m.loc[m["last_rank"] >= 0]
    if has.empty:
        return []
    # chance: 1/n of the ranks that took part (a window holds fewer than comm_size);
    # the correction: over the job's ranks, which a window's were chosen among
    n = int(has["n_ranks"].max()) if "n_ranks" in has.columns else int(m["comm_size"].max())
    job_n = job_ranks(ctx, max(n, int(m["comm_size"].max())))
    winners = has["last_rank"].to_numpy()
    gains = has.groupby("last_rank")["lead_ns"].sum().sort_values(ascending=False, kind="stable")
    found: list[Finding] = []
    for rank in gains.index[:MAX_LATE]:
        test = tested(winners, int(rank), n, job_n)
        if test is None:
            break
        f = _matched_finding(ctx, m, has, test, n)
        if found and not f.significant:
            break
        found.append(f)
        if not f.significant:
            break
    return found


def _matched_finding(ctx: Context, m: pd.DataFrame, has: pd.DataFrame, test: ChanceTest,
                     n: int) -> Finding:
    late = test.candidate
    steps = ctx.n_steps if ctx.n_steps else 1
    mine = has.loc[has["last_rank"] == late]
    waits = mine["wait_ns"].to_numpy(dtype=np.float64) / 1e6
    # averaged over the ranks that took part (a window holds fewer than comm_size)
    others_wait = float((waits / mine["n_ranks"].clip(lower=1).to_numpy()).sum()) / steps
    # the counterfactual: each call it is last in starts at the arrival before its
    # own, so the step ends that lead sooner (blocking calls, one after another)
    leads = mine["lead_ns"].to_numpy(dtype=np.float64) / 1e6
    per_step = float(leads.sum()) / steps
    _, blo, bhi = bootstrap_mean(leads)
    scale = len(leads) / steps
    lo, hi = blo * scale, bhi * scale
    lateness = float(has.loc[has["last_rank"] == late, "spread_ns"].median()) / 1e6
    slow_transfer = _slow_transfers(ctx.steady_df, late)
    why = ("its transfers are slower than the others' (longer data calls at the same start)"
           if slow_transfer else
           "it arrives late (its calls start after the others'), transfers are not slower")
    err = clock_error_ms(ctx.meta)
    significant = test.significant and ctx.significant(lo)
    details = [why + ".", f"last at {test.describe('matched calls')}."]
    conf = f"95% interval over {len(m)} matched calls"
    if err > 0 and err >= 0.5 * max(lateness, 1e-9):
        significant = False
        details.append(f"clocks are aligned within {fmt_ms(err)}, not enough to order "
                       f"arrivals {fmt_ms(lateness)} apart: not a conclusion.")
        conf = "clocks too uncertain"
    cost: float | None = per_step
    if not ctx.n_steps:  # no steps: the waiting is over the run, not per step
        cost, lo, hi = None, float("nan"), float("nan")
        significant = False
    return Finding(
        key="late_ranks",
        headline=f"Rank {late} arrives last in {fmt_share(test.share)} of matched calls",
        details=details,
        cost_ms=cost, cost_interval_ms=(lo, hi) if cost is not None else None,
        cost_img_s=ctx.cost_img_s(cost) if cost is not None else None,
        confidence=conf,
        recommendation=(f"find what rank {late} does differently (data loading, CPU "
                        "placement, other processes on its cores)" if significant else ""),
        check="profiler summarize TRACE --by rank; profiler compare BEFORE AFTER",
        numbers={"rank": late, "last_share": test.share, "p_value": test.p_value,
                 "lateness_ms": lateness, "step_gain_ms": cost,
                 "others_wait_ms_per_step": others_wait if cost is not None else None,
                 "source": "matched", "clock_error_ms": err},
        significant=significant, part="wait_ranks" if cost is not None else "", null=NULL,
    )


def _name_the_neighbour(ctx: Context, f: Finding) -> None:
    """When the late rank's CPUs have a noisy neighbour (contention: processes
    outside the job took NEIGHBOUR_SHARE of them and made its compute thread
    wait), say so and name it first in the recommendation."""
    late = f.numbers.get("rank")
    n = rank_neighbour(ctx, int(late)) if isinstance(late, (int, np.integer)) else None
    if n is None:
        return
    named = n.named()
    f.details.append(f"{n.where()}, was busy {fmt_share(n.foreign_share)} of the run with "
                     "processes outside the job" + (f": {named}" if named else "")
                     + " (noisy_neighbour).")
    f.numbers["neighbour"] = {"cpus": n.cpus, "foreign_share": n.foreign_share,
                              "processes": [{k: p.get(k) for k in ("pid", "name", "share")}
                                            for p in n.procs[:3]]}
    if f.recommendation:
        top = next((p for p in n.procs if p["share"] >= NAMED_SHARE), None)
        who = f"pid {top['pid']} ({top['name']})" if top else "the other processes"
        f.recommendation = (f"move {who} off CPU {format_ranges(n.cpus)}, where rank {late} "
                            f"runs, or move rank {late} to a free core (noisy_neighbour); "
                            "then: " + f.recommendation)


def _whole_job(ctx: Context) -> dict | None:
    """When the frame is a bounded window of a bigger dataset: the straggler
    ranking over every matched collective of the job, out of core
    (engine.stragglers_dataset), so that a late rank outside the window is
    still named.  None when the frame is the whole trace."""
    sel = ctx.df.attrs.get("selection")
    if not sel or not ctx.path:
        return None
    # the window's own pass over every rank (analysis.load.window_for), else one now
    windows = [w for w in sel.values() if isinstance(w, dict)]
    passed = [w.get("stragglers") for w in windows]
    steps = int(windows[0].get("job_steps") or 0) if windows else 0
    if passed and passed[0]:
        ranking = pd.DataFrame(passed[0])
        n_ranks = len(ctx.meta.get("ranks") or []) or len(ranking)
    else:
        from ..engine import stragglers_dataset

        try:
            kinds = ["data"] if "kind" in ctx.df.columns else None
            ranking = stragglers_dataset(ctx.path, kinds=kinds)
        except Exception:  # a trace without a dataset: the window is all there is
            return None
        n_ranks = len(ranking)
    if ranking.empty or int(ranking["last_count"].max()) == 0:
        return None
    top = ranking.iloc[0]
    rows = {int(r["rank"]): {"order": i + 1, "last_share": float(r["last_share"]),
                             "gain_s": float(r.get("gain_s", 0.0))}
            for i, r in enumerate(ranking.head(16).to_dict("records"))}
    return {"rank": int(top["rank"]), "last_share": float(top["last_share"]),
            "caused_wait_s": float(top["caused_wait_s"]),
            "gain_s": float(top.get("gain_s", 0.0)), "ranks": n_ranks,
            "top": [int(r) for r in ranking["rank"].head(4)], "by_rank": rows,
            "steps": steps}


def _whole_job_details(f: Finding, job: dict) -> None:
    """The whole-job pass beside a late rank of the window: where it ranks this
    rank, and what its leads over every matched call come to per step."""
    mine = job["by_rank"].get(int(f.numbers["rank"]))
    f.numbers["whole_job"] = {k: v for k, v in job.items() if k != "by_rank"}
    where = (f"rank {f.numbers['rank']} is {_waited_for(mine['order'])} (last in "
             f"{fmt_share(mine['last_share'])} of them"
             if mine is not None else
             f"rank {job['rank']} arrives last most often ({fmt_share(job['last_share'])}")
    per_step = ""
    if mine is not None:
        f.numbers["whole_job"]["rank_order"] = mine["order"]
        f.numbers["whole_job"]["gain_s_of_rank"] = mine["gain_s"]
        if job["steps"]:
            ms = mine["gain_s"] * 1e3 / job["steps"]
            f.numbers["whole_job"]["gain_ms_per_step"] = ms
            per_step = f", {fmt_ms(ms)} per step of the run"
        gain = mine["gain_s"]
    else:
        gain = job["gain_s"]
    f.details.append(
        f"over every matched call of the job ({job['ranks']} ranks, not only the "
        f"window): {where}; without its lateness those calls would start "
        f"{fmt_ms(gain * 1e3)} sooner in all{per_step})"
        + ("; the most waited for: " + ", ".join(str(r) for r in job["top"])
           if job["top"] else "") + ".")


def _waited_for(k: int) -> str:
    """'the rank the others wait for most', 'the second ...', 'number 5 of the ...'."""
    if k <= 3:
        return "the " + ("", "second ", "third ")[k - 1] + "rank the others wait for most"
    return f"number {k} of the ranks the others wait for most"


def analyze(ctx: Context) -> list[Finding]:
    if len(ctx.ranks) < 2:
        return []
    found = _from_breakdown(ctx)
    if found is None:
        found = _from_matched(ctx)
    late = [f for f in found if f.key == "late_ranks"]
    for f in late:
        _name_the_neighbour(ctx, f)
    job = _whole_job(ctx)
    if job is not None:
        for f in late:
            _whole_job_details(f, job)
    return found
