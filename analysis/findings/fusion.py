"""Tensor fusion: would another HOROVOD_FUSION_THRESHOLD buy anything?

From the run's fusion lineage (lineage.parquet beside the trace, written at
merge) and every rank's Horovod allreduces and broadcasts,
analysis.fusion_whatif replays Horovod's packing at other thresholds, at the
run's own cycle time.  Its figure is transfer time (each predicted call at
fusion_whatif.latency_model's curve: a bench trace's when `profiler advise
TRACE --bench BENCH` gives one of this fabric, else the run's own data calls,
its start-up broadcasts scaled to its allreduces; from the last rank's
arrival to the last return, no waits for late ranks), so the finding's cost
is the transfer time per step that the best threshold would save over the
run's own, capped by what the step waits for after the last rank's arrival
(the breakdown's ``transfer`` and ``horovod`` parts: fewer calls means fewer
cycles too).  Its error is the
prediction's error as far as the run tells it (WhatIf.error: the largest of
the calls and the transfer time it predicts at the run's own setting against
what the run made, and the latency fit's at its sizes); the whole figure
when the latency model is `wide` (fitted on Horovod's control calls, or its
broadcasts and allreduces disagree) or the run was contended.  A threshold
is recommended only when the saving exceeds that error and the noise floor.

Where the job's threads wait for a core (the compute thread's run-queue wait
at least contention.UNCONTENDED_SHARE of its time), each data call also costs
the CPU Horovod's thread spends in it (MPI polls while it waits for its
peers), taken from the compute threads: that part is the calls saved x the
run's own CPU per data call (call_cpu: the thread's time in data calls before
the rank entered synchronize, while the compute ran, at most its schedstat
time in the step, over its calls; later calls are the step's to wait for,
priced by the transfer part already), capped by the compute thread's
run-queue wait per step (freed CPU cannot give it back more than it waited),
less the copying fusion adds (each tensor into the fusion buffer and out,
at MEMCPY_BYTES_PER_S).
Without contention the part is 0: a thread on a free core costs the step
nothing while it polls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats.horovod_env import DEFAULT_FUSION_THRESHOLD
from profiler.units import fmt_bytes, fmt_ms

from .base import MIN_STEPS, Context, Finding

#: fewer data calls than this per step and rank leave the per-call CPU unmeasured
MIN_CALLS_PER_STEP = 2
#: thresholds whose predicted time is within this share of the best tie
TIE = 0.01
#: a fused call copies each tensor into the fusion buffer and back out, on
#: Horovod's thread: charged at this rate (bytes/s), the low end of one
#: thread's memcpy beyond its caches, so the copying is not underestimated
MEMCPY_BYTES_PER_S = 2e9


def call_cpu(ctx: Context) -> dict[str, float] | None:
    """The CPU a data call takes from a contended job's compute threads.

    Per steady step and rank: the part of the step's data calls (on Horovod's
    thread) that ran before the rank entered synchronize, while its compute
    thread was running, and above the call's size's floor (the run's
    FLOOR_PERCENTILE for that size: the bytes move in a fused call too); at
    most Horovod's thread's time on a CPU in the step (its "cpu" row); over
    all of the step's data calls.  A call after that
    point is waited for by the step, which the transfer and horovod parts
    price already: counting its CPU too would count it twice.  Returns
    {per_call_ms, lo_ms, hi_ms} (mean over steps and its 95% interval),
    {main_wait_ms} (the compute thread's run-queue wait per step outside
    synchronize) and {contended} (1.0 when that wait is at least
    UNCONTENDED_SHARE of its time); None without cpu or sync rows or data
    calls."""
    from profiler.formats.classify import is_horovod_row

    from ..fusion_whatif import FLOOR_PERCENTILE
    from ..stats import bootstrap_mean
    from .contention import UNCONTENDED_SHARE, cpu_rows, cpu_waits

    rows = cpu_rows(ctx.df)
    df = ctx.df
    if rows.empty or "kind" not in df.columns or not ctx.n_steps:
        return None
    steady = ctx.steady["step"].to_numpy()
    bg = rows.loc[(rows["kind"] == "horovod") & rows["step"].isin(steady)]
    ops = df["op"].astype(str).to_numpy()
    sync = df.loc[(ops == "sync") & df["seq"].isin(steady).to_numpy()]
    data = df.loc[is_horovod_row(df) & (df["kind"].astype(str) == "data").to_numpy()
                  & df["step"].isin(steady).to_numpy()]
    if bg.empty or data.empty or sync.empty:
        return None
    entered = (sync.assign(step=sync["seq"].astype(np.int64))
               .groupby(["step", "rank"])["t_start_ns"].min().rename("sync_ns"))
    d = data[["step", "rank", "bytes", "t_start_ns", "t_end_ns"]].join(
        entered, on=["step", "rank"])
    # a call's time above its size's floor (the run's FLOOR_PERCENTILE of
    # that size): the bytes move in a fused call too, the rest is the call's
    dur = (d["t_end_ns"] - d["t_start_ns"]).astype(np.float64)
    floor = dur.groupby(d["bytes"]).transform(lambda v: np.percentile(v, FLOOR_PERCENTILE))
    d = d.assign(excess=(dur - floor).clip(lower=0.0)).loc[d["sync_ns"].notna()]
    hidden = np.minimum((np.minimum(d["t_end_ns"], d["sync_ns"]) - d["t_start_ns"])
                        .clip(lower=0), d["excess"])
    calls = d.assign(hidden=hidden.astype(np.float64)).groupby(["step", "rank"]).agg(
        n=("hidden", "size"), ns=("hidden", "sum"))
    t = bg.groupby(["step", "rank"])["run_ns"].sum().to_frame().join(calls, how="inner")
    t = t.loc[t["n"] >= MIN_CALLS_PER_STEP]
    if t.empty:
        return None
    per_call = (np.minimum(t["run_ns"], t["ns"]) / t["n"] / 1e6).groupby("step").mean()
    mean, lo, hi = bootstrap_mean(per_call.to_numpy())
    step_bytes = float(data.groupby(["step", "rank"])["bytes"].sum().mean())
    waits = cpu_waits(ctx)
    waits = waits.loc[waits.index.isin(steady)] if len(waits) else waits
    main_wait = float(waits.mean(axis=1).mean()) if len(waits) else 0.0
    wall = float(ctx.steady["wall_ms"].mean())
    contended = bool(len(waits) and wall > 0 and main_wait >= UNCONTENDED_SHARE * wall)
    return {"per_call_ms": mean, "lo_ms": lo, "hi_ms": hi, "main_wait_ms": max(0.0, main_wait),
            "contended": 1.0 if contended else 0.0,
            "copy_ms": 2.0 * step_bytes / MEMCPY_BYTES_PER_S * 1e3}


def _lineage(ctx: Context) -> pd.DataFrame | None:
    """The lineage table written beside the trace (None when there is none)."""
    from profiler import layout
    from profiler.errors import ProfilerError
    from profiler.formats import lineage as LF

    if not ctx.path:
        return None
    p = Path(ctx.path)
    d = p if p.is_dir() else p.parent
    info = ctx.meta.get("lineage")
    name = info.get("file") if isinstance(info, dict) else None
    for c in ([d / name] if isinstance(name, str) and "/" not in name else []) + [
            d / layout.LINEAGE_FILE]:
        if c.is_file():
            try:
                return LF.load(c)
            except ProfilerError:
                return None
    return None


def _label(th: int) -> str:
    return fmt_bytes(th) if th else "0 (fusion off)"


def analyze(ctx: Context, lineage: pd.DataFrame | None = None,
            bench: Context | None = None) -> list[Finding]:
    """`bench`: a `profiler bench` trace of the same fabric, whose allreduce
    curve then prices the predicted calls (fusion_whatif.latency_model)."""
    from ..fusion_whatif import ranks_per_host, whatif
    from .efficiency import mismatch

    if ctx.n_steps < MIN_STEPS or "rank" not in ctx.df.columns:
        return []
    lin = lineage if lineage is not None else _lineage(ctx)
    if lin is None or lin.empty:
        return []
    hosts = [r.get("host", "") for r in ctx.meta.get("ranks") or [] if isinstance(r, dict)]
    try:
        if bench is not None and mismatch(ctx, bench):  # not this run's fabric
            bench = None
        w = whatif(lin, ctx.df, ctx.meta.get("env") or {},
                   local_size=ranks_per_host(hosts) if hosts else None,
                   bench=bench.df if bench is not None else None)
    except (KeyError, ValueError):  # a lineage or frame without what the replay reads
        return []
    if w is None or not np.isfinite(w.calls_error):
        return []
    t = w.table.loc[w.table["cycle_ms"] == w.cycle_ms].copy()
    cpu = call_cpu(ctx)
    per_call = cpu["per_call_ms"] if cpu is not None and cpu["contended"] else 0.0
    t["cpu_ms_per_step"] = t["calls_per_step"] * per_call
    t["total_ms_per_step"] = t["transfer_ms_per_step"] + t["cpu_ms_per_step"]
    # among thresholds that tie (within TIE of the best), Horovod's default,
    # else the largest: the same calls with the most headroom
    low = float(t["total_ms_per_step"].min())
    ties = t.loc[t["total_ms_per_step"] <= low * (1.0 + TIE) + 1e-9]
    pick = ties.loc[ties["threshold"] == DEFAULT_FUSION_THRESHOLD]
    best = (pick if len(pick) else ties.sort_values("threshold")).iloc[-1]
    gain_t = max(0.0, w.base_comm_ms - float(best["transfer_ms_per_step"]))
    bd = ctx.breakdown  # time that overlaps compute costs nothing
    if len(bd) and (bd["source"] != "none").any():
        gain_t = min(gain_t, ctx.part_ms("transfer") + ctx.part_ms("horovod"))
    elif "exposed_ms" in ctx.steady.columns:
        gain_t = min(gain_t, float(ctx.steady["exposed_ms"].mean()))
    # the prediction's error as far as this run tells it (WhatIf.error: its
    # calls, its transfer time and the latency fit; the whole figure when the
    # latency model is wide or the run contended), so a threshold is
    # recommended only when its gain exceeds what the replay gets wrong here
    err = w.error * w.base_comm_ms if np.isfinite(w.error) else w.base_comm_ms
    # the CPU the saved calls take from the compute threads (call_cpu), at
    # most the compute thread's run-queue wait; its interval is the per-call
    # CPU's, over the calls the replay may get wrong
    saved = max(0.0, w.base_calls - float(best["calls_per_step"]))
    gain_c = lo_c = hi_c = 0.0
    if per_call > 0 and cpu is not None and saved > 0:
        cap = cpu["main_wait_ms"]
        calls_err = w.calls_error if np.isfinite(w.calls_error) else 1.0
        copy = cpu["copy_ms"]  # what fusing adds: every tensor in and out of the buffer
        gain_c = min(max(0.0, saved * per_call - copy), cap)
        lo_c = min(max(0.0, max(0.0, saved * (1.0 - calls_err)) * cpu["lo_ms"] - copy), cap)
        hi_c = min(saved * (1.0 + calls_err) * cpu["hi_ms"], cap)
    gain = gain_t + gain_c
    lo, hi = max(0.0, gain_t - err) + lo_c, gain_t + err + hi_c
    better = int(best["threshold"]) != w.threshold and lo > 0
    significant = better and ctx.significant(lo)
    if better:
        headline = (f"HOROVOD_FUSION_THRESHOLD={_label(int(best['threshold']))} would cut data "
                    f"calls from {w.base_calls:.1f} to {float(best['calls_per_step']):.1f} "
                    "per step")
    elif np.isfinite(w.error) and w.error >= 1.0:  # wide or contended: no time trusted
        headline = (f"The fusion threshold ({_label(w.threshold)}) is kept: this run's "
                    "transfer times do not price other thresholds (see latency)")
    else:
        headline = (f"The fusion threshold ({_label(w.threshold)}) is as good as any tried "
                    "for this job")
    tried = ", ".join(f"{_label(int(r.threshold))}: {r.calls_per_step:.1f} calls, "
                      f"{fmt_ms(r.transfer_ms_per_step)}"
                      for r in t.sort_values("threshold").itertuples(index=False))
    return [Finding(
        key="fusion",
        headline=headline,
        details=[f"predicted per step at HOROVOD_CYCLE_TIME={w.cycle_ms:g} ms: {tried}.",
                 f"the prediction for this run's own setting is {w.base_calls:.1f} calls per "
                 f"step against {w.actual_calls:.1f} made ({100 * w.calls_error:.0f}% error); "
                 f"times are transfer only (from the last rank's arrival): this run's data "
                 f"calls {fmt_ms(w.actual_comm_median_ms)} in the median step (predicted "
                 f"{fmt_ms(w.base_comm_ms)}), "
                 f"{fmt_ms(w.actual_wait_ms)}/step on rank 0 with its waits.",
                 f"latency: {_source(w)}."]
        + ([f"CPU: Horovod's thread spent {fmt_ms(cpu['per_call_ms'])} on a CPU per data "
            f"call while the compute ran (MPI polls while it waits for its peers), on cores "
            f"where the compute thread waited {fmt_ms(cpu['main_wait_ms'])} per step for one: "
            + (f"{saved:.1f} fewer calls per step free {fmt_ms(saved * per_call)} of it, "
               f"less {fmt_ms(cpu['copy_ms'])} to copy the step's "
               f"{fmt_bytes(cpu['copy_ms'] / 2e3 * MEMCPY_BYTES_PER_S)} in and out of the "
               f"fusion buffer (at {MEMCPY_BYTES_PER_S / 1e9:g} GB/s): {fmt_ms(gain_c)} "
               f"[{fmt_ms(lo_c)}, {fmt_ms(hi_c)}]." if saved > 0 else
               "the other thresholds make no fewer calls.")]
           if per_call > 0 and cpu is not None else []),
        cost_ms=gain if better else 0.0, cost_interval_ms=(lo, hi) if better else None,
        cost_img_s=ctx.cost_img_s(gain) if better else None,
        confidence=(f"replay of {w.steps} steps; error = the replay's own error on this run "
                    f"({100 * w.error:.0f}%)" if np.isfinite(w.error) else
                    f"replay of {w.steps} steps; error unknown"),
        recommendation=(f"HOROVOD_FUSION_THRESHOLD={int(best['threshold'])}" if significant
                        else "keep the threshold"),
        check="profiler tensors TRACE --whatif; then profiler compare BEFORE AFTER",
        numbers={"threshold": w.threshold, "best_threshold": int(best["threshold"]),
                 "calls_per_step": w.base_calls, "best_calls_per_step":
                 float(best["calls_per_step"]), "saved_ms": gain, "error_ms": err,
                 "calls_error": w.calls_error, "comm_error": w.comm_error,
                 "error": w.error, "contention": w.contention,
                 "transfer_saved_ms": gain_t, "cpu_saved_ms": gain_c,
                 "cpu_per_call_ms": cpu["per_call_ms"] if cpu is not None else None,
                 "main_wait_ms": cpu["main_wait_ms"] if cpu is not None else None,
                 "cpu_contended": bool(cpu is not None and cpu["contended"]),
                 "latency_source": w.latency.source if w.latency is not None else "",
                 "latency_wide": bool(w.latency is not None and w.latency.wide),
                 "table": _records(t)},
        significant=significant, part="transfer",
        null="the replay's own error on this run: a threshold is recommended only when its "
             "gain exceeds what the replay gets wrong at the run's own setting; the CPU the "
             "saved calls would free counts only where the compute thread waits for a core "
             "(at most its wait)",
    )]


def _source(w: Any) -> str:
    """What priced the predicted calls, and why not to trust it, in words."""
    if w.latency is None:
        return "unknown"
    why = w.distrust()
    return w.latency.describe() + ("; the times are not trusted: " + "; ".join(why)
                                   if why else "")


def _records(t: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
            for r in t.to_dict(orient="records")]
