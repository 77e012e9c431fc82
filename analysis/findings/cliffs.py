"""Message sizes on latency cliffs: sizes whose median latency in the run sits
far above the run's own alpha-beta fit (analysis.model.anomalies).

A size can be slow in a run for two reasons: the size itself (the MPI library's
algorithm or protocol switch at that size, a buffer that is not a power of
two), or the moment its calls ran (a fused buffer that always goes out during
the backward pass waits for cores the compute threads hold).  The run alone
cannot tell them apart, so the finding is not claimed until a replay of those
sizes and their neighbours, alone, with the job's MPI settings
(`profiler advise --confirm`, or any `profiler bench` trace of the same
fabric passed as `replay`), finds them slower than their reference by
MIN_RATIO.  A size's reference is the lower of the log-log line through its
nearest sizes that are not flagged and the fastest larger size: on one
algorithm a message is never slower than a larger one, so a size slower than
a larger one is flagged too (the fit alone misses a cliff that covers most of
the run's sizes).  The replay decides the cause; the run's own calls price
it: the cost is their median time above the run's reference at the confirmed
sizes, times the calls per step at them (part ``transfer``), at most what
the step waits for transfers and Horovod plus the compute thread's wait for
a CPU (a busy-polling call on a full machine slows the compute beside it,
and nothing more).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from profiler.units import fmt_bytes, fmt_ms

from .base import Context, Finding, bootstrap_mean

MIN_SIZES = 4
#: A replayed size counts as a cliff at this many times its reference.
MIN_RATIO = 1.5
#: calls a size needs before it can be a larger size's reference or be
#: flagged for being slower than one (start-up broadcasts happen once a rank)
MIN_CALLS = 5

NULL = (f"the size's neighbours: a replay of the sizes alone, with the job's MPI settings, "
        f"finds the size at least {MIN_RATIO:g}x slower than the line through the nearest "
        "sizes that are not flagged, or than a larger size")


def flagged_sizes(ctx: Context) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every size of the run's data calls with its fit, the flagged ones)."""
    from ..model import anomalies, fit_models, latency_by_size

    df = ctx.steady_df
    stats = latency_by_size(df)
    if stats.empty or stats["bytes"].nunique() < MIN_SIZES:
        return stats.iloc[0:0], stats.iloc[0:0]
    models = fit_models(df, stats=stats)
    an = anomalies(df, models=models, stats=stats)
    an["anomalous"] = an["anomalous"].astype(bool) | _inverted(an)
    return an, an.loc[an["anomalous"]]


def _inverted(an: pd.DataFrame) -> pd.Series:
    """Sizes (with MIN_CALLS calls) at least MIN_RATIO slower than a larger
    size of the same op and label (with MIN_CALLS calls)."""
    out = pd.Series(False, index=an.index)
    keys = [k for k in ("label", "op") if k in an.columns]
    for _, sub in (an.groupby(keys, sort=False) if keys else [((), an)]):
        sub = sub.loc[sub["calls"] >= MIN_CALLS].sort_values("bytes", ascending=False)
        faster = sub["median_us"].cummin().shift(1)  # the fastest larger size
        out.loc[sub.index] = (sub["median_us"] >= MIN_RATIO * faster).fillna(False)
    return out.astype(bool)


def _per_size(st: pd.DataFrame) -> pd.DataFrame:
    """A latency_by_size table as one median per size (bytes, median_us), by size."""
    return st.groupby("bytes", as_index=False)["median_us"].median().sort_values("bytes")


def reference_us(st: pd.DataFrame, size: int, exclude: set[int]) -> float:
    """What `size` would take without a cliff, from a per-size table (bytes,
    median_us) of one op: the lower of the log-log line through its nearest
    sizes not in `exclude` (one side only: that neighbour) and the fastest
    larger size; NaN with neither."""
    ref = st.loc[~st["bytes"].isin(exclude)]
    below = ref.loc[ref["bytes"] < size].tail(1)
    above = ref.loc[ref["bytes"] > size].head(1)
    line = math.nan
    if len(below) and len(above):
        x0, y0 = float(below["bytes"].iloc[0]), float(below["median_us"].iloc[0])
        x1, y1 = float(above["bytes"].iloc[0]), float(above["median_us"].iloc[0])
        t = (np.log(size) - np.log(x0)) / (np.log(x1) - np.log(x0))
        line = float(np.exp(np.log(y0) + t * (np.log(y1) - np.log(y0))))
    elif len(below) or len(above):
        line = float((below if len(below) else above)["median_us"].iloc[0])
    larger = st.loc[st["bytes"] > size, "median_us"]
    fastest = float(larger.min()) if len(larger) else math.nan
    return float(np.nanmin([line, fastest])) if np.isfinite([line, fastest]).any() else math.nan


def replay_sizes(an: pd.DataFrame, flagged: pd.DataFrame, elem: int = 4) -> list[int]:
    """The sizes a replay measures: each flagged size, the run's nearest
    unflagged sizes around it, and half and twice it (multiples of `elem`)."""
    sizes = sorted(int(b) for b in an["bytes"].unique() if b > 0)
    bad = {int(b) for b in flagged["bytes"]}
    good = [s for s in sizes if s not in bad]
    out: set[int] = set()
    for s in sorted(bad):
        out.add(s)
        below = [g for g in good if g < s]
        above = [g for g in good if g > s]
        if below:
            out.add(below[-1])
        if above:
            out.add(above[0])
        for v in (s // 2, s * 2):
            v -= v % elem
            if v >= elem:
                out.add(v)
    return sorted(out)


def confirm(replay: pd.DataFrame, sizes: list[int]) -> pd.DataFrame:
    """Each flagged size's replayed median against its reference among the
    replayed sizes (reference_us, the flagged ones left out of the line).
    Columns: bytes, median_us, neighbour_us, ratio, confirmed."""
    from ..model import latency_by_size

    cols = ["bytes", "median_us", "neighbour_us", "ratio", "confirmed"]
    st = latency_by_size(replay)
    if st.empty:
        return pd.DataFrame({c: [] for c in cols})
    st = _per_size(st)
    rows = []
    for s in sizes:
        hit = st.loc[st["bytes"] == s, "median_us"]
        line = reference_us(st, s, set(sizes))
        if hit.empty or not np.isfinite(line):
            continue
        med = float(hit.iloc[0])
        ratio = med / line if line > 0 else float("nan")
        rows.append({"bytes": s, "median_us": med, "neighbour_us": line, "ratio": ratio,
                     "confirmed": bool(np.isfinite(ratio) and ratio >= MIN_RATIO)})
    return pd.DataFrame(rows, columns=cols)


def run_excess_us(an: pd.DataFrame, sizes: list[int]) -> dict[int, float]:
    """Per size: the run's median above its reference in the run (reference_us
    over the run's sizes of its most frequent op, with MIN_CALLS calls, the
    flagged ones out of the line), at least 0."""
    if an.empty:
        return {}
    op = an.groupby("op")["calls"].sum().idxmax() if "op" in an.columns else None
    st = an.loc[(an["op"] == op) if op is not None else slice(None)]
    st = _per_size(st.loc[st["calls"] >= MIN_CALLS])
    bad = {int(b) for b in an.loc[an["anomalous"].astype(bool), "bytes"]}
    out = {}
    for s in sizes:
        hit = st.loc[st["bytes"] == s, "median_us"]
        ref = reference_us(st, s, bad | {s})
        if len(hit) and np.isfinite(ref):
            out[s] = max(0.0, float(hit.iloc[0]) - ref)
    return out


def _calls_per_step(ctx: Context, sizes: list[int]) -> np.ndarray:
    """Per steady step: data calls at these sizes, per rank."""
    from .._frame import calls

    c = calls(ctx.steady_df, kinds=["data"], columns=["rank", "bytes", "step"])
    c = c.loc[c["bytes"].isin(sizes) & c["step"].isin(ctx.steady["step"])]
    n = max(len(ctx.ranks), 1)
    per = c.groupby("step").size().reindex(ctx.steady["step"], fill_value=0) / n
    return per.to_numpy(dtype=np.float64)


def _cpu_wait_ms(ctx: Context) -> float:
    """The main threads' run-queue wait per steady step outside synchronize,
    averaged over the ranks (0 without the profiler's "cpu" rows)."""
    from .contention import cpu_waits

    t = cpu_waits(ctx)
    if t.empty:
        return 0.0
    t = t.loc[t.index.isin(ctx.steady["step"])]
    return float(t.to_numpy().mean()) if t.size else 0.0


def _phase(ctx: Context, sizes: list[int]) -> str:
    """How many of the flagged sizes' calls started while their rank's main
    thread was computing (outside synchronize), in words ('' without a
    breakdown)."""
    bd = ctx.breakdown
    if bd.empty or (bd["source"] != "sync").all():
        return ""
    from .._frame import calls

    c = calls(ctx.steady_df, kinds=["data"], columns=["rank", "bytes", "t_start_ns"])
    c = c.loc[c["bytes"].isin(sizes)]
    if c.empty:
        return ""
    inside = np.zeros(len(c), dtype=bool)
    for r, sub in bd.loc[bd["sync_start_ns"] >= 0].groupby("rank"):
        sel = (c["rank"] == r).to_numpy()
        t = c["t_start_ns"].to_numpy()[sel]
        a = sub["sync_start_ns"].to_numpy()
        e = sub["sync_end_ns"].to_numpy()
        order = np.argsort(a)
        a, e = a[order], e[order]
        j = np.searchsorted(a, t, side="right") - 1
        inside[np.flatnonzero(sel)] = (j >= 0) & (t < e[np.maximum(j, 0)])
    during = int((~inside).sum())
    return (f"{during} of their {len(c)} calls ran while the compute threads were busy "
            "(before the rank entered synchronize)")


def analyze(ctx: Context, replay: Context | None = None) -> list[Finding]:
    an, flagged = flagged_sizes(ctx)
    if flagged.empty:
        return []
    steps = ctx.n_steps if ctx.n_steps else 0
    per = steps if steps else 1
    ranks = max(len(ctx.ranks), 1)
    lost_us = float(((flagged["median_us"] - flagged["model_us"]) * flagged["calls"]).sum())
    lost_ms = lost_us / 1e3 / per / ranks
    non_pow2 = int((~flagged["is_pow2"].astype(bool)).sum())
    worst = flagged.sort_values("ratio", ascending=False).head(3)
    shown = ", ".join(f"{fmt_bytes(int(b))} ({r:.1f}x)" for b, r in
                      zip(worst["bytes"], worst["ratio"]))
    sizes = [int(b) for b in flagged["bytes"]]
    unit = "step" if steps else "run"
    head = (f"{len(flagged)} of {len(an)} message sizes sit above the latency fit or a "
            f"larger size's time ({non_pow2} not powers of two)")
    numbers = {"sizes": sizes, "lost_ms": lost_ms, "non_pow2": non_pow2,
               "ratios": [float(r) for r in flagged["ratio"]], "per": unit,
               "replay_sizes": replay_sizes(an, flagged)}
    phase = _phase(ctx, sizes)
    if replay is None:
        details = [f"in this run's calls, worst: {shown}; {fmt_ms(lost_ms)} per {unit} and "
                   "rank above the fit."]
        if phase:
            details.append(phase + ": the moment, not the size, may have made them slow.")
        return [Finding(
            key="latency_cliffs", headline=head + ": not confirmed",
            details=details, cost_ms=None, confidence="not confirmed by a replay",
            recommendation="", check="profiler advise TRACE --confirm",
            numbers={**numbers, "confirmed": None}, significant=False, part="transfer",
            null=NULL, not_claimed=("a replay of these sizes alone (profiler advise TRACE "
                                    "--confirm) decides whether they are slow by themselves"))]
    res = confirm(replay.df, sizes)
    numbers["replay"] = res.to_dict(orient="records")
    ok = res.loc[res["confirmed"]]
    if ok.empty:
        tried = ", ".join(f"{fmt_bytes(int(r.bytes))} {r.ratio:.2f}x"
                          for r in res.itertuples(index=False))
        return [Finding(
            key="latency_cliffs", headline=head + ": not slow when replayed alone",
            details=[f"in this run, worst: {shown}.",
                     f"replayed alone against their neighbours: {tried or 'no size replayed'}."]
            + ([phase + "."] if phase else []),
            cost_ms=None, confidence=f"replay of {len(res)} sizes",
            recommendation="", check="",
            numbers={**numbers, "confirmed": []}, significant=False, part="transfer",
            null=NULL, not_claimed=("a replay of these sizes alone found them as fast as "
                                    "their neighbours: the moment their calls ran made them "
                                    "slow, not their size"))]
    conf_sizes = [int(b) for b in ok["bytes"]]
    # the replay decides the cause; the run's own calls price it (module docstring)
    run_us = run_excess_us(an, conf_sizes)
    excess_ms = {b: run_us.get(b, 0.0) / 1e3 for b in conf_sizes}
    exposed = ctx.part_ms("transfer") + ctx.part_ms("horovod") + _cpu_wait_ms(ctx)
    capped = False
    if steps:
        per_step = sum(_calls_per_step(ctx, [b]) * ms for b, ms in excess_ms.items())
        mean, lo, hi = bootstrap_mean(np.asarray(per_step, dtype=np.float64))
        # the slow calls cost the step only where it waits for them, or where
        # they kept its compute off a core (the rest ran beside the compute)
        if len(ctx.parts) and np.isfinite(mean) and mean > exposed:
            capped = True
            mean, lo, hi = exposed, min(lo, exposed), exposed
    else:
        mean = lo = hi = float("nan")
    odd_all = all(int(b) & (int(b) - 1) for b in conf_sizes)  # none a power of two
    rec = ("pad fused buffers to a power of two (HOROVOD_FUSION_THRESHOLD a power of two)"
           if odd_all else
           "the MPI library's collective algorithm for this size range: compare its "
           "algorithms there (Open MPI: coll_tuned_allreduce_algorithm, or a dynamic rules "
           "file; MPICH: MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM)")
    env = ctx.meta.get("env") or {}
    rules = {k: v for k, v in env.items() if "coll_tuned" in str(k)}
    details = ["replayed alone: " + ", ".join(
        f"{fmt_bytes(int(r.bytes))} {r.median_us:.0f} us against {r.neighbour_us:.0f} us "
        f"({r.ratio:.1f}x)" for r in ok.itertuples(index=False)) + "."]
    if rules:
        details.append("the job set Open MPI's tuned-collective rules: "
                       + ", ".join(f"{k}={v}" for k, v in sorted(rules.items())) + ".")
    if steps:
        n_calls = float(np.mean(_calls_per_step(ctx, conf_sizes)))
        details.append(f"this job makes {n_calls:.1f} calls per step and rank at "
                       f"{'those sizes' if len(ok) > 1 else 'that size'}.")
        details.append("in this run they took " + ", ".join(
            f"{fmt_bytes(b)} {ms * 1e3:.0f} us" for b, ms in excess_ms.items())
            + " a call above the run's own reference: that, times the calls, is the cost.")
    if capped:
        details.append(f"their excess, {fmt_ms(float(np.mean(per_step)))} per step, is more "
                       "than the step waits for transfers and Horovod plus its compute "
                       f"thread's wait for a CPU ({fmt_ms(exposed)}): the rest ran beside "
                       "the compute; the cost is that part.")
    significant = bool(steps) and ctx.significant(lo)
    plural = len(ok) > 1
    return [Finding(
        key="latency_cliffs",
        headline=(f"{len(ok)} message size{'s are' if plural else ' is'} slow by "
                  f"{'themselves' if plural else 'itself'}: "
                  + ", ".join(fmt_bytes(b) for b in conf_sizes)),
        details=details,
        cost_ms=mean if steps else None,
        cost_interval_ms=(lo, hi) if steps else None,
        cost_img_s=ctx.cost_img_s(mean) if steps else None,
        confidence=f"replay of {len(res)} sizes; 95% interval over {steps} steps",
        recommendation=rec if significant else "",
        check="profiler advise TRACE --confirm after the change",
        numbers={**numbers, "confirmed": conf_sizes, "excess_ms": excess_ms},
        significant=significant, part="transfer", null=NULL,
    )]
