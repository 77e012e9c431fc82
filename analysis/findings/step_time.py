"""Where the step time goes: communication vs the rest, and how much of the
communication the step waits for (exposed), per step and per rank
(analysis.throughput defines comm_union and exposed)."""

from __future__ import annotations

import numpy as np

from profiler.units import fmt_ms, fmt_share

from .base import MIN_STEPS, Context, Finding, bootstrap_mean


def analyze(ctx: Context) -> list[Finding]:
    s = ctx.steady
    if ctx.n_steps < MIN_STEPS:
        return []
    wall = s["wall_ms"].to_numpy(dtype=np.float64)
    comm = s["comm_union_ms"].to_numpy(dtype=np.float64)
    exposed = s["exposed_ms"].to_numpy(dtype=np.float64)
    total = float(wall.sum())
    comm_share = float(comm.sum()) / total if total > 0 else 0.0
    exp_share = float(exposed.sum()) / total if total > 0 else 0.0
    mean, lo, hi = bootstrap_mean(exposed)
    ctrl = float(s["control_ms"].mean()) if "control_ms" in s.columns else 0.0
    allc = float(s["comm_ms"].mean()) if "comm_ms" in s.columns else 0.0
    details = [
        f"communication {fmt_ms(float(comm.mean()))}/step overlaps the rest of the step; "
        f"{fmt_ms(mean)}/step ({fmt_share(exp_share)}) is waited for at the step's end.",
    ]
    rs = ctx.steady_rank_steps
    if len(rs) and rs["rank"].nunique() > 1:
        per = rs.groupby("rank")[["comm_union_ms", "wall_ms"]].mean()
        share = per["comm_union_ms"] / per["wall_ms"].where(per["wall_ms"] > 0, np.nan)
        hi_r, lo_r = int(share.idxmax()), int(share.idxmin())
        if fmt_share(float(share.max())) == fmt_share(float(share.min())):
            details.append(f"per rank: communication {fmt_share(float(share.max()))} of the "
                           "step on every rank.")
        else:
            details.append(f"per rank: communication {fmt_share(float(share.max()))} of the "
                           f"step on rank {hi_r}, {fmt_share(float(share.min()))} on rank "
                           f"{lo_r}.")
    if allc > 0 and ctrl / allc > 0.5:
        details.append(f"{fmt_share(ctrl / allc)} of the time in MPI calls is Horovod's "
                       "control plane (negotiation, response cache), not gradient data.")
    significant = ctx.significant(lo)
    return [Finding(
        key="step_time",
        headline=(f"Communication is {fmt_share(comm_share)} of the step, "
                  f"{fmt_share(exp_share)} of the step exposed"),
        details=details,
        cost_ms=mean, cost_interval_ms=(lo, hi), cost_img_s=ctx.cost_img_s(mean),
        confidence=f"95% interval over {ctx.n_steps} steady steps",
        recommendation=("the exposed part is what faster communication or more overlap can "
                        "buy: see the findings on late ranks, fusion and message sizes"
                        if significant else "communication is not what limits this job"),
        check="profiler compare BEFORE/trace.json AFTER/trace.json",
        numbers={"steps": ctx.n_steps, "step_ms": ctx.step_ms, "comm_ms": float(comm.mean()),
                 "comm_share": comm_share, "exposed_ms": mean, "exposed_share": exp_share,
                 "control_ms": ctrl},
        significant=significant,
    )]
