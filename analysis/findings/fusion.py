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

Not priced: the CPU Horovod's thread spends polling in unfused calls on
cores the compute shares.  A rank's polling lasts until its peer arrives,
however many calls that wait is split into (the attempt to price it and why
it did not hold: docs/validation.md, "Fusion lineage and what-if").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats.horovod_env import DEFAULT_FUSION_THRESHOLD
from profiler.units import fmt_bytes, fmt_ms

from .base import MIN_STEPS, Context, Finding

#: thresholds whose predicted time is within this share of the best tie
TIE = 0.01


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
    t = w.table.loc[w.table["cycle_ms"] == w.cycle_ms]
    # among thresholds that tie (within TIE of the best), Horovod's default,
    # else the largest: the same calls with the most headroom
    low = float(t["transfer_ms_per_step"].min())
    ties = t.loc[t["transfer_ms_per_step"] <= low * (1.0 + TIE) + 1e-9]
    pick = ties.loc[ties["threshold"] == DEFAULT_FUSION_THRESHOLD]
    best = (pick if len(pick) else ties.sort_values("threshold")).iloc[-1]
    gain = max(0.0, w.base_comm_ms - float(best["transfer_ms_per_step"]))
    bd = ctx.breakdown  # time that overlaps compute costs nothing
    if len(bd) and (bd["source"] != "none").any():
        gain = min(gain, ctx.part_ms("transfer") + ctx.part_ms("horovod"))
    elif "exposed_ms" in ctx.steady.columns:
        gain = min(gain, float(ctx.steady["exposed_ms"].mean()))
    # the prediction's error as far as this run tells it (WhatIf.error: its
    # calls, its transfer time and the latency fit; the whole figure when the
    # latency model is wide or the run contended), so a threshold is
    # recommended only when its gain exceeds what the replay gets wrong here
    err = w.error * w.base_comm_ms if np.isfinite(w.error) else w.base_comm_ms
    lo, hi = max(0.0, gain - err), gain + err
    better = int(best["threshold"]) != w.threshold and gain > err
    significant = better and ctx.significant(lo)
    if better:
        verb = "cut" if float(best["calls_per_step"]) < w.base_calls else "take"
        headline = (f"HOROVOD_FUSION_THRESHOLD={_label(int(best['threshold']))} would {verb} "
                    f"data calls from {w.base_calls:.1f} to "
                    f"{float(best['calls_per_step']):.1f} per step")
    elif np.isfinite(w.error) and w.error >= 1.0:  # wide or contended: no time trusted
        headline = (f"The fusion threshold ({_label(w.threshold)}) is kept: this run's "
                    "transfer times do not price other thresholds (see latency)")
    else:
        headline = (f"The fusion threshold ({_label(w.threshold)}) is as good as any tried "
                    "for this job")
    predicted = None
    if better:  # the step this model predicts at that threshold (analysis.predict)
        from ..predict import Target, remedy_line

        predicted = remedy_line(ctx, Target(fusion_threshold=int(best["threshold"])),
                                f"HOROVOD_FUSION_THRESHOLD={_label(int(best['threshold']))}",
                                lin)
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
                 f"latency: {_source(w)}."] + ([predicted[0]] if predicted else []),
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
                 "latency_source": w.latency.source if w.latency is not None else "",
                 "latency_wide": bool(w.latency is not None and w.latency.wide),
                 "table": _records(t), **(predicted[1] if predicted else {})},
        significant=significant, part="transfer",
        null="the replay's own error on this run: a threshold is recommended only when its "
             "gain exceeds what the replay gets wrong at the run's own setting",
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
