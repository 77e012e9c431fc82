"""Late ranks: which rank arrives last at the job's synchronization points, how
often, why (it arrives late, or its transfers are slow), and what the others'
waiting costs per step.

Evidence, best first:

* "sync" rows (the time each rank spent inside hvd.DistributedOptimizer.step,
  recorded by the step hook): a rank that reaches the step late waits least in
  it; the others wait for it.  This sees Horovod jobs, whose collectives start
  together on every rank once all ranks have submitted a tensor.
* matched collectives (analysis.imbalance): the spread of their start times on
  the ranks (MPI programs that call collectives directly).

A claim needs clocks aligned better than the lateness it reports.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.units import fmt_ms, fmt_share

from .base import MIN_STEPS, Context, Finding, bootstrap_mean


def clock_error_ms(meta: dict) -> float:
    """The largest clock-offset error bound among the ranks (ms; 0 on one host)."""
    worst = 0
    for r in meta.get("ranks") or []:
        if isinstance(r, dict) and (r.get("offset_method") or 0) > 0:
            worst = max(worst, int(r.get("offset_err_ns") or 0),
                        int(r.get("offset_end_err_ns") or 0))
    return worst / 1e6


def _sync_waits(ctx: Context) -> pd.DataFrame | None:
    """Per (step, rank): ms spent inside optimizer.step ("sync" rows)."""
    df = ctx.df
    if "op" not in df.columns:
        return None
    sync = df.loc[(df["op"] == "sync").to_numpy(dtype=bool)]
    if sync.empty or sync["rank"].nunique() < 2:
        return None
    w = pd.DataFrame({"step": sync["seq"].to_numpy(dtype=np.int64),
                      "rank": sync["rank"].to_numpy(dtype=np.int64),
                      "wait_ms": sync["dur_ns"].to_numpy(dtype=np.float64) / 1e6})
    if ctx.n_steps:
        w = w.loc[w["step"].isin(ctx.steady["step"])]
    return w


def _from_sync(ctx: Context, w: pd.DataFrame) -> Finding | None:
    table = w.pivot_table(index="step", columns="rank", values="wait_ms", aggfunc="sum")
    table = table.dropna()
    if len(table) < MIN_STEPS:
        return None
    n = table.shape[1]
    least = table.idxmin(axis=1)               # the rank that waited least: the late one
    extra = table.sub(table.min(axis=1), axis=0)  # what the others waited for it
    others = extra.sum(axis=1) / max(n - 1, 1)    # ms per step, per waiting rank
    late = int(least.mode().iloc[0])
    share = float((least == late).mean())
    mean, lo, hi = bootstrap_mean(others.to_numpy())
    lateness = float(extra.drop(columns=[late]).median(axis=None)) if n > 1 else 0.0
    return _finding(ctx, late, share, len(table), mean, lo, hi, lateness,
                    "it reaches optimizer.step later than the others (its forward, backward "
                    "or data loading takes longer); the others wait for its gradients",
                    "sync")


def _from_matched(ctx: Context) -> Finding | None:
    from ..imbalance import stragglers

    m = ctx.matched
    if m.empty:
        return None
    ranking = stragglers(matched=m)
    if ranking.empty or int(ranking["last_count"].max()) == 0:
        return None
    top = ranking.iloc[0]
    late = int(top["rank"])
    n = int(m["comm_size"].max())
    steps = ctx.n_steps if ctx.n_steps else 1
    # wait_ns: all ranks' waiting for the last arrival, summed over matched calls
    waits = m.loc[m["last_rank"] == late, "wait_ns"].to_numpy(dtype=np.float64) / 1e6
    total_ms = float(waits.sum()) / max(n - 1, 1)
    per_step = total_ms / steps
    boot = bootstrap_mean(waits / max(n - 1, 1))
    scale = len(waits) / steps
    lo, hi = boot[1] * scale, boot[2] * scale
    slow_transfer = _slow_transfers(ctx.steady_df, late)
    why = ("its transfers are slower than the others' (longer data calls at the same start)"
           if slow_transfer else
           "it arrives late (its calls start after the others'), transfers are not slower")
    return _finding(ctx, late, float(top["last_share"]), len(m), per_step, lo, hi,
                    float(top["mean_lateness_us"]) / 1e3, why, "matched")


def _slow_transfers(df: pd.DataFrame, rank: int) -> bool:
    """The rank's median data-call duration exceeds every other rank's by half."""
    from .._frame import calls

    c = calls(df, kinds=["data"], columns=["rank", "dur_ns"])
    if c.empty or c["rank"].nunique() < 2:
        return False
    med = c.groupby("rank")["dur_ns"].median()
    others = med.drop(index=rank, errors="ignore")
    return bool(len(others) and med.get(rank, 0) > 1.5 * float(others.max()))


def _finding(ctx: Context, late: int, share: float, matched: int, cost: float | None, lo: float,
             hi: float, lateness_ms: float, why: str, source: str) -> Finding:
    err = clock_error_ms(ctx.meta)
    significant = ctx.significant(lo)
    details = [why + "."]
    conf = f"95% interval over {matched} {'steps' if source == 'sync' else 'matched calls'}"
    if err > 0 and err >= 0.5 * max(lateness_ms, 1e-9):
        significant = False
        details.append(f"clocks are aligned within {fmt_ms(err)}, not enough to order "
                       f"arrivals {fmt_ms(lateness_ms)} apart: not a conclusion.")
        conf = "clocks too uncertain"
    if not ctx.n_steps:  # no steps: the waiting is over the run, not per step
        cost, lo, hi = None, float("nan"), float("nan")
        significant = False
    return Finding(
        key="late_ranks",
        headline=f"Rank {late} arrives last in {fmt_share(share)} of "
                 f"{'steps' if source == 'sync' else 'matched calls'}",
        details=details,
        cost_ms=cost, cost_interval_ms=(lo, hi) if cost is not None else None,
        cost_img_s=ctx.cost_img_s(cost) if cost is not None else None,
        confidence=conf,
        recommendation=(f"find what rank {late} does differently (data loading, CPU "
                        "placement, other processes on its cores)" if significant else ""),
        check="profiler summarize TRACE --by rank; profiler compare BEFORE AFTER",
        numbers={"rank": late, "last_share": share, "lateness_ms": lateness_ms,
                 "others_wait_ms_per_step": cost, "source": source, "clock_error_ms": err},
        significant=significant,
    )


def _whole_job(ctx: Context) -> dict | None:
    """When the frame is a bounded window of a bigger dataset: the straggler
    ranking over every matched collective of the job, out of core
    (engine.stragglers_dataset), so that a late rank outside the window is
    still named.  None when the frame is the whole trace."""
    if not ctx.df.attrs.get("selection") or not ctx.path:
        return None
    from ..engine import stragglers_dataset

    try:
        kinds = ["data"] if "kind" in ctx.df.columns else None
        ranking = stragglers_dataset(ctx.path, kinds=kinds)
    except Exception:  # a trace without a dataset: the window is all there is
        return None
    if ranking.empty or int(ranking["last_count"].max()) == 0:
        return None
    top = ranking.iloc[0]
    return {"rank": int(top["rank"]), "last_share": float(top["last_share"]),
            "caused_wait_s": float(top["caused_wait_s"]), "ranks": len(ranking),
            "top": [int(r) for r in ranking["rank"].head(4)]}


def analyze(ctx: Context) -> list[Finding]:
    if len(ctx.ranks) < 2:
        return []
    w = _sync_waits(ctx)
    f = _from_sync(ctx, w) if w is not None else None
    if f is None:
        f = _from_matched(ctx)
    job = _whole_job(ctx)
    if job is not None and f is not None:
        f.numbers["whole_job"] = job
        same = "the same rank" if job["rank"] == f.numbers["rank"] else f"rank {job['rank']}"
        f.details.append(
            f"over every matched call of the job ({job['ranks']} ranks, not only the "
            f"window): {same} arrives last most often ({fmt_share(job['last_share'])}, "
            f"{fmt_ms(job['caused_wait_s'] * 1e3)} of the others' waiting)"
            + ("; next: " + ", ".join(str(r) for r in job["top"][1:]) if job["top"][1:] else "")
            + ".")
    return [f] if f is not None else []
