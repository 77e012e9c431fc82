"""Message sizes on latency cliffs: sizes whose median latency sits far above
the run's own alpha-beta fit (analysis.model.anomalies), what they cost per
step, and what padding to the next power of two would save
(analysis.model.padding_whatif)."""

from __future__ import annotations

import numpy as np

from profiler.units import fmt_bytes, fmt_ms

from .base import Context, Finding

MIN_SIZES = 4


def analyze(ctx: Context) -> list[Finding]:
    from ..model import anomalies, fit_models, latency_by_size, padding_summary, padding_whatif

    df = ctx.steady_df
    stats = latency_by_size(df)
    if stats.empty or stats["bytes"].nunique() < MIN_SIZES:
        return []
    models = fit_models(df, stats=stats)
    an = anomalies(df, models=models, stats=stats)
    flagged = an.loc[an["anomalous"].astype(bool)]
    if flagged.empty:
        return []
    steps = ctx.n_steps if ctx.n_steps else 0
    per = steps if steps else 1
    ranks = max(len(ctx.ranks), 1)
    # time above the fit at the flagged sizes, per step and rank (calls over all ranks)
    lost_us = float(((flagged["median_us"] - flagged["model_us"]) * flagged["calls"]).sum())
    lost_ms = lost_us / 1e3 / per / ranks
    w = padding_whatif(df, models=models, stats=stats)
    saved = padding_summary(w)
    saved_ms = float(saved["saved_us_helpful"].sum()) / 1e3 / per if len(saved) else 0.0
    non_pow2 = int((~flagged["is_pow2"].astype(bool)).sum())
    worst = flagged.sort_values("ratio", ascending=False).head(3)
    sizes = ", ".join(f"{fmt_bytes(int(b))} ({r:.1f}x)" for b, r in
                      zip(worst["bytes"], worst["ratio"]))
    unit = "step" if steps else "run"
    significant = ctx.significant(lost_ms) if steps else False
    return [Finding(
        key="latency_cliffs",
        headline=(f"{len(flagged)} of {len(an)} message sizes sit above the latency fit "
                  f"({non_pow2} not powers of two)"),
        details=[f"worst: {sizes}.",
                 f"time above the fit at those sizes: {fmt_ms(lost_ms)} per {unit} and rank; "
                 f"padding every message to the next power of two would save "
                 f"{fmt_ms(saved_ms)} per {unit}."],
        cost_ms=lost_ms if steps else None,
        cost_img_s=ctx.cost_img_s(lost_ms) if steps else None,
        confidence="sizes at robust z >= 3.5 and >= 1.5x the fit; cost = their time above it",
        recommendation=("pad fused buffers to a power of two (or choose "
                        "HOROVOD_FUSION_THRESHOLD so that they are)" if significant
                        else "not worth padding here"),
        check="profiler bench --sizes-from TRACE",
        numbers={"sizes": [int(b) for b in flagged["bytes"]], "lost_ms": lost_ms,
                 "padding_saves_ms": saved_ms,
                 "ratios": [float(r) for r in flagged["ratio"]],
                 "non_pow2": non_pow2, "per": unit, "mean_ratio": float(np.mean(
                     flagged["ratio"]))},
        significant=significant,
    )]
