"""Horovod's control plane: the response-cache bit-vector allreduce it runs every
cycle, and the negotiations (gather/gatherv/bcast) of tensors the cache does not
hold, per step and as a share of the time in MPI calls.

The per-cycle allreduce runs on Horovod's background thread whatever the job
does; it costs step time only through the breakdown's ``horovod`` part
(findings.cycle) or by taking a core from compute (findings.contention).  The
one claim made here is tested against the response cache's behaviour: after
the first step every tensor is cached, so a job that still negotiates
uncached tensors every step has the cache off or too small."""

from __future__ import annotations

import numpy as np

from profiler.formats.horovod_env import settings as horovod_settings
from profiler.units import fmt_ms, fmt_share

from .base import MIN_STEPS, Context, Finding

NEGOTIATION_OPS = ("gather", "gatherv")


def analyze(ctx: Context) -> list[Finding]:
    df = ctx.df
    if "kind" not in df.columns or ctx.n_steps < MIN_STEPS:
        return []
    s = ctx.steady
    ctrl_calls = float(s["control_calls"].mean())
    if ctrl_calls <= 0:
        return []
    ctrl_ms = float(s["control_ms"].mean())
    comm_ms = float(s["comm_ms"].mean())
    share = ctrl_ms / comm_ms if comm_ms > 0 else 0.0
    rs = ctx.steady_rank_steps
    neg = 0.0
    if len(rs):
        sel = df.loc[(df["kind"] == "control").to_numpy(dtype=bool)
                     & df["op"].isin(NEGOTIATION_OPS).to_numpy(dtype=bool)
                     & df["step"].isin(s["step"]).to_numpy(dtype=bool)]
        neg = len(sel) / max(len(rs), 1)  # per rank and step
    env = ctx.meta.get("env") or {}
    hs = horovod_settings(env)  # as Horovod read them
    cycle = f"{hs.cycle_time_ms:g} ms" + ("" if "HOROVOD_CYCLE_TIME" in env else " (default)")
    cache = f"{hs.cache_capacity}" + ("" if "HOROVOD_CACHE_CAPACITY" in env else " (default)")
    step_s = ctx.step_ms / 1e3 if np.isfinite(ctx.step_ms) and ctx.step_ms > 0 else float("nan")
    rate = ctrl_calls / step_s if step_s == step_s else float("nan")
    details = [f"{ctrl_calls:.0f} control calls per step and rank ({rate:.0f}/s at "
               f"HOROVOD_CYCLE_TIME={cycle}), {fmt_ms(ctrl_ms)} per step in them: "
               f"{fmt_share(share)} of the time in communication calls."]
    rec = ""
    if neg >= 1:
        details.append(f"{neg:.1f} uncached negotiations per step and rank "
                       f"(HOROVOD_CACHE_CAPACITY={cache}): tensors miss the response cache.")
        rec = ("the response cache is off or too small for the job's tensors: "
               "HOROVOD_CACHE_CAPACITY=1024 (or more than the tensors per step)")
    details.append("this is background-thread time; it costs step time only where it "
                   "competes with compute for cores, so no step-time cost is claimed.")
    return [Finding(
        key="control_plane",
        headline=(f"Control traffic: {ctrl_calls:.0f} negotiation/cache calls per step, "
                  f"{fmt_share(share)} of communication time"),
        details=details, cost_ms=None, confidence="counted exactly",
        recommendation=rec,
        check="HOROVOD_CACHE_CAPACITY=1024 ...; then profiler compare BEFORE AFTER" if rec else "",
        numbers={"control_calls_per_step": ctrl_calls, "control_ms_per_step": ctrl_ms,
                 "control_share": share, "negotiations_per_step": neg,
                 "calls_per_s": rate},
        significant=bool(rec), null=("the response cache: after the first step no tensor "
                                     "is negotiated again"),
    )]
