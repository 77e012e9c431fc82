"""Message sizes on latency cliffs: sizes whose median latency in the run sits
far above what the fabric's curve gives them.

A size can be slow in a run for two reasons: the size itself (the MPI library's
algorithm or protocol switch at that size, a buffer that is not a power of
two), or the moment its calls ran (a fused buffer that always goes out during
the backward pass waits for cores the compute threads hold).  The run alone
cannot tell them apart, so the finding is not claimed until a replay of those
sizes and the sizes around them, alone, with the job's MPI settings
(`profiler advise --confirm`, or any `profiler bench` trace of the same
fabric passed as `replay`), finds them slower than their reference by
MIN_RATIO.

Suspects, per op, judged against references the size cannot pull (the
largest size, or the fused buffer, has no larger size beside it and would
pull a fit that includes it): (1) the run's alpha-beta fit, and the same fit
with the size left out of its line and of its noise scale
(analysis.model.anomalies): MIN_RATIO and a robust z of 3.5; (2) a larger
size's time: on one algorithm a message is never slower than a larger one
(the fit alone misses a cliff over most of the sizes); (3) smaller sizes'
time per byte: on one algorithm time per byte only falls with size (alpha/n
+ beta), so a size PER_BYTE_RATIO above the lowest of any smaller size's is
suspect.  (3) cannot fire on the flat latency-bound part of a curve (time
per byte falls there fastest) and is set above what a protocol switch
costs; (4) with a bench (`advise --bench`), the fabric's own curve at the
size, MIN_RATIO: the only reference a fused buffer alone has (a run of
fewer than MIN_SIZES sizes is judged by (4) only, and without a bench not
at all).  Sizes in (2), (3) and (4) need MIN_CALLS calls.

A size's reference in a replay or in the run is the lower of the log-log
line through its nearest sizes that are not flagged (from one side only: the
line through the two nearest there, its slope held between 0 and 1 -- time
neither falls with size nor grows faster than it) and the fastest larger
size; the replay brackets each suspect from both sides (replay_sizes).  The
replay decides the cause; the run's own calls price it, as a counterfactual:
per step, every call at the confirmed sizes less what a call of its size
takes on the run's curve (the reference, times the mean-over-median of the
sizes without a cliff: the stalls every size has), tails included -- a slow
algorithm's long stalls are its cost, and a median would leave them out
(part ``transfer``; excess_per_step), at most what the step waits for
transfers and Horovod plus the compute thread's wait for a CPU (a
busy-polling call on a full machine slows the compute beside it, and nothing
more).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from profiler.units import fmt_bytes, fmt_ms

from .. import remedies
from .base import Context, Finding, bootstrap_mean

MIN_SIZES = 4
#: A replayed size counts as a cliff at this many times its reference.
MIN_RATIO = 1.5
#: calls a size needs before it can be another size's reference or be
#: flagged against one (start-up broadcasts happen once a rank)
MIN_CALLS = 5
#: A size is suspect at this many times the lowest time per byte of a smaller
#: size: above a protocol switch's cost (a switch to a slower algorithm, 1.5x
#: per byte, or eager to rendezvous with its higher latency, under 1.8x at the
#: switch), far below a cliff's (an 8x cliff 1.33x above its neighbour: 6x).
PER_BYTE_RATIO = 2.0

NULL = (f"the size's neighbours: a replay of the sizes alone, with the job's MPI settings, "
        f"finds the size at least {MIN_RATIO:g}x slower than the line through the nearest "
        "sizes on both sides that are not flagged, or than a larger size")


def flagged_sizes(ctx: Context, bench: pd.DataFrame | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every size of the run's data calls with its reference, the flagged
    ones); model_us of a flagged size is the lowest reference that flagged it.
    `bench`: a bench's latency_by_size table; with one, a run of fewer than
    MIN_SIZES sizes (a fused buffer alone) is judged against its curve only."""
    from ..model import anomalies, fit_models, latency_by_size

    df = ctx.steady_df
    stats = latency_by_size(df)
    few = stats.empty or stats["bytes"].nunique() < MIN_SIZES
    if stats.empty or (few and bench is None):
        return stats.iloc[0:0], stats.iloc[0:0]
    rules: list[Callable[[pd.DataFrame], tuple[pd.Series, pd.Series]]] = [
        _inverted, _costlier_per_byte]
    if few:
        an = stats.copy()
        an["model_us"], an["ratio"], an["anomalous"] = np.nan, np.nan, False
        rules = []
    else:
        an = anomalies(df, models=fit_models(df, stats=stats), stats=stats)
    if bench is not None:
        rules.append(lambda t: _above_bench(t, bench))
    fit = an["anomalous"].astype(bool)
    ref = an["model_us"].where(fit)
    for rule in rules:
        hit, rule_ref = rule(an)
        ref = ref.where(~hit | (ref <= rule_ref), rule_ref)
        fit |= hit
    an["anomalous"] = fit
    an.loc[fit, "model_us"] = ref[fit]
    an.loc[fit, "ratio"] = an.loc[fit, "median_us"] / ref[fit]
    return an, an.loc[an["anomalous"]]


def _groups(an: pd.DataFrame):  # type: ignore[no-untyped-def]
    """The table by label and op, each with MIN_CALLS calls and bytes > 0."""
    keys = [k for k in ("label", "op") if k in an.columns]
    for _, sub in (an.groupby(keys, sort=False) if keys else [((), an)]):
        yield sub.loc[(sub["calls"] >= MIN_CALLS) & (sub["bytes"] > 0)]


def _inverted(an: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Sizes (with MIN_CALLS calls) at least MIN_RATIO slower than a larger
    size of the same op and label (with MIN_CALLS calls), and that size's time."""
    out = pd.Series(False, index=an.index)
    ref = pd.Series(np.nan, index=an.index)
    for sub in _groups(an):
        sub = sub.sort_values("bytes", ascending=False)
        faster = sub["median_us"].cummin().shift(1)  # the fastest larger size
        out.loc[sub.index] = (sub["median_us"] >= MIN_RATIO * faster).fillna(False)
        ref.loc[sub.index] = faster
    return out.astype(bool), ref


def _costlier_per_byte(an: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Sizes (with MIN_CALLS calls) whose time per byte is PER_BYTE_RATIO times
    the lowest of a smaller size of the same op and label (with MIN_CALLS
    calls), and the time that lowest per byte gives them."""
    out = pd.Series(False, index=an.index)
    ref = pd.Series(np.nan, index=an.index)
    for sub in _groups(an):
        sub = sub.sort_values("bytes")
        per_byte = sub["median_us"] / sub["bytes"]
        best = per_byte.cummin().shift(1) * sub["bytes"]  # at the best smaller size's rate
        out.loc[sub.index] = (sub["median_us"] >= PER_BYTE_RATIO * best).fillna(False)
        ref.loc[sub.index] = best
    return out.astype(bool), ref


def _above_bench(an: pd.DataFrame, bench: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Sizes (with MIN_CALLS calls) at least MIN_RATIO slower in the run than
    the bench's curve gives them, and that time (_bench_reference_us: a
    bench with the same cliff flags it too).  What no rule of the run's own
    curve can judge: a fused buffer alone, the largest size.  Measured alone,
    the bench is faster than calls beside compute, so the replay decides."""
    out = pd.Series(False, index=an.index)
    ref = pd.Series(np.nan, index=an.index)
    for sub in _groups(an):
        op = str(sub["op"].iloc[0]) if "op" in sub.columns and len(sub) else None
        r = sub["bytes"].map(_bench_reference_us(bench, op, [int(b) for b in sub["bytes"]]))
        ref.loc[sub.index] = r.astype(np.float64)
        out.loc[sub.index] = (sub["median_us"] >= MIN_RATIO * r).fillna(False)
    return out.astype(bool), ref


def _per_size(st: pd.DataFrame) -> pd.DataFrame:
    """A latency_by_size table as one median per size (bytes, median_us), by size."""
    return st.groupby("bytes", as_index=False)["median_us"].median().sort_values("bytes")


def _loglog(p0: tuple[float, float], p1: tuple[float, float], size: float) -> float:
    """The log-log line through two (bytes, us) points, at `size`, its slope
    held between 0 and 1 (time neither falls with size nor outgrows it)."""
    slope = (math.log(p1[1]) - math.log(p0[1])) / (math.log(p1[0]) - math.log(p0[0]))
    slope = min(max(slope, 0.0), 1.0)
    return float(math.exp(math.log(p0[1]) + slope * (math.log(size) - math.log(p0[0]))))


def reference_us(st: pd.DataFrame, size: int, exclude: set[int]) -> float:
    """What `size` would take without a cliff, from a per-size table (bytes,
    median_us) of one op: the lower of the log-log line through its nearest
    sizes not in `exclude` (one side only: the line through the two nearest
    there, its slope held between 0 and 1; one size: its time) and the
    fastest larger size; NaN with neither."""
    ref = st.loc[~st["bytes"].isin(exclude) & (st["bytes"] > 0) & (st["median_us"] > 0)]
    pts = sorted((float(b), float(t)) for b, t in zip(ref["bytes"], ref["median_us"]))
    lo = [p for p in pts if p[0] < size]
    hi = [p for p in pts if p[0] > size]
    line = math.nan
    if lo and hi:
        line = _loglog(lo[-1], hi[0], size)
    elif len(lo) >= 2:
        line = _loglog(lo[-2], lo[-1], size)
    elif len(hi) >= 2:
        line = _loglog(hi[0], hi[1], size)
    elif lo or hi:
        line = (lo or hi)[0][1]
    larger = st.loc[st["bytes"] > size, "median_us"]
    fastest = float(larger.min()) if len(larger) else math.nan
    return float(np.nanmin([line, fastest])) if np.isfinite([line, fastest]).any() else math.nan


def replay_sizes(an: pd.DataFrame, flagged: pd.DataFrame, elem: int = 4) -> list[int]:
    """The sizes a replay measures: each flagged size, the run's nearest
    unflagged sizes around it, and half and twice it; where the run has no
    unflagged size on one side (the largest size, the smallest), also 1.5x or
    0.75x it, so that both sides bracket it (multiples of `elem`)."""
    sizes = sorted(int(b) for b in an["bytes"].unique() if b > 0)
    bad = {int(b) for b in flagged["bytes"]}
    good = [s for s in sizes if s not in bad]
    out: set[int] = set()
    for s in sorted(bad):
        out.add(s)
        below = [g for g in good if g < s]
        above = [g for g in good if g > s]
        extra = [s // 2, s * 2]
        if below:
            out.add(below[-1])
        else:
            extra.append(s * 3 // 4)
        if above:
            out.add(above[0])
        else:
            extra.append(s * 3 // 2)
        for v in extra:
            v -= v % elem
            if elem <= v != s:
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


def _main_op(an: pd.DataFrame) -> str | None:
    """The run's most frequent op (the one its table and references are of)."""
    return str(an.groupby("op")["calls"].sum().idxmax()) if "op" in an.columns and len(an) \
        else None


def _main_rows(an: pd.DataFrame) -> pd.DataFrame:
    """The rows of the run's most frequent op."""
    op = _main_op(an)
    return an.loc[an["op"].astype(str) == op] if op is not None else an


def _run_table(an: pd.DataFrame) -> tuple[pd.DataFrame, set[int]]:
    """(the per-size table of the run's most frequent op, with MIN_CALLS calls;
    the flagged sizes)."""
    st = _main_rows(an)
    return (_per_size(st.loc[st["calls"] >= MIN_CALLS]),
            {int(b) for b in an.loc[an["anomalous"].astype(bool), "bytes"]})


def _bench_reference_us(bench: pd.DataFrame, op: str | None, sizes: list[int]
                        ) -> dict[int, float]:
    """Per size: the fabric's own curve there, from a `profiler bench` of the
    same hosts and settings (reference_us over the bench's latency_by_size
    table of `op`, the size itself left out)."""
    if bench.empty or not sizes:
        return {}
    b = bench.loc[bench["op"].astype(str) == op] if op and "op" in bench.columns else bench
    curve = _per_size(b) if len(b) else b
    refs = {s: reference_us(curve, s, {s}) for s in sizes} if len(curve) else {}
    return {s: r for s, r in refs.items() if np.isfinite(r) and r > 0}


def _run_reference_us(an: pd.DataFrame, sizes: list[int]) -> dict[int, float]:
    """Per size: its reference in the run (reference_us over the run's table,
    the flagged sizes out of the line)."""
    if an.empty:
        return {}
    st, bad = _run_table(an)
    refs = {s: reference_us(st, s, bad | {s}) for s in sizes}
    return {s: r for s, r in refs.items() if np.isfinite(r)}


def run_excess_us(an: pd.DataFrame, sizes: list[int]) -> dict[int, float]:
    """Per size: the run's median above its reference in the run, at least 0."""
    if an.empty:
        return {}
    st, _ = _run_table(an)
    out = {}
    for s, ref in _run_reference_us(an, sizes).items():
        hit = st.loc[st["bytes"] == s, "median_us"]
        if len(hit):
            out[s] = max(0.0, float(hit.iloc[0]) - ref)
    return out


def tail_factor(an: pd.DataFrame, sizes: list[int]) -> float:
    """How much a call's mean exceeds its median in this run at sizes without
    a cliff (the median over the run's unflagged sizes of the most frequent op,
    with MIN_CALLS calls, of mean / median; 1 without them): the waits for a
    core and other stalls every size has, which a reference taken at the
    median leaves out."""
    if an.empty or "mean_us" not in an.columns:
        return 1.0
    st = _main_rows(an)
    st = st.loc[(st["calls"] >= MIN_CALLS) & ~st["anomalous"].astype(bool)
                & ~st["bytes"].isin(sizes) & (st["median_us"] > 0)]
    ratio = (st["mean_us"] / st["median_us"]).replace([np.inf, -np.inf], np.nan).dropna()
    return max(float(ratio.median()), 1.0) if len(ratio) else 1.0


def excess_per_step(ctx: Context, ref_us: dict[int, float]) -> np.ndarray:
    """Per steady step, what the calls at the confirmed sizes took beyond their
    reference (ms, per rank): each call's duration less the reference of its
    size, summed over the step's calls and averaged over the ranks.  The
    counterfactual step without the cliff: every call, its tail included (a
    slow algorithm's stalls are its cost), against what a call of that size
    takes on this run's curve, stalls included (ref_us: median reference x
    tail_factor)."""
    from .._frame import calls

    c = calls(ctx.steady_df, kinds=["data"], columns=["rank", "bytes", "step", "dur_ns"])
    c = c.loc[c["bytes"].isin(list(ref_us)) & c["step"].isin(ctx.steady["step"])]
    over = c["dur_ns"].to_numpy(dtype=np.float64) / 1e6 - c["bytes"].map(
        {b: r / 1e3 for b, r in ref_us.items()}).to_numpy(dtype=np.float64)
    n = max(len(ctx.ranks), 1)
    per = pd.Series(over, index=c.index).groupby(c["step"]).sum()
    return (per.reindex(ctx.steady["step"], fill_value=0.0) / n).to_numpy(dtype=np.float64)


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
    fw = remedies.framework(ctx.meta)
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
            f"(before the rank entered {remedies.sync_name(fw)})")


def analyze(ctx: Context, replay: Context | None = None,
            bench: Context | None = None) -> list[Finding]:
    from ..model import latency_by_size

    bench_st = latency_by_size(bench.steady_df) if bench is not None else None
    an, flagged = flagged_sizes(ctx, bench_st)
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
    head = (f"{len(flagged)} of {len(an)} message sizes sit above the curve through the "
            f"other sizes, a larger size's time{',' if bench is not None else ' or'} smaller "
            f"sizes' time per byte{' or the bench curve' if bench is not None else ''} "
            f"({non_pow2} not powers of two)")
    numbers = {"sizes": sizes, "lost_ms": lost_ms, "non_pow2": non_pow2,
               "ratios": [float(r) for r in flagged["ratio"]], "per": unit,
               "replay_sizes": replay_sizes(an, flagged)}
    phase = _phase(ctx, sizes)
    if replay is None:
        details = [f"in this run's calls, worst: {shown}; {fmt_ms(lost_ms)} per {unit} and "
                   "rank above the curve."]
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
    tail = tail_factor(an, conf_sizes)
    ref_us = {b: tail * ref for b, ref in _run_reference_us(an, conf_sizes).items()}
    # a size the run has no reference for (a fused buffer alone): the bench's
    # curve there, measured alone, so without the run's stalls (tail 1)
    on_bench: dict[int, float] = {}
    if bench_st is not None:
        st, _ = _run_table(an)
        on_bench = _bench_reference_us(bench_st, _main_op(an),
                                       [b for b in conf_sizes if b not in ref_us])
        for b, r in on_bench.items():
            hit = st.loc[st["bytes"] == b, "median_us"]
            if len(hit):
                run_us[b] = max(0.0, float(hit.iloc[0]) - r)
        ref_us.update(on_bench)
    excess_ms = {b: run_us.get(b, 0.0) / 1e3 for b in conf_sizes}
    exposed = ctx.part_ms("transfer") + ctx.part_ms("horovod") + _cpu_wait_ms(ctx)
    capped = False
    if steps:
        per_step = excess_per_step(ctx, ref_us)
        mean, lo, hi = bootstrap_mean(per_step)
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
        details.append("in this run their median call took " + ", ".join(
            f"{fmt_bytes(b)} {ms * 1e3:.0f} us" for b, ms in excess_ms.items())
            + " above the run's own reference; the cost is every call's time above it, "
            f"tails included, against the reference's own (its median x {tail:.2f}, the "
            "mean over median of the sizes without a cliff), summed per step.")
        if on_bench:
            details.append("the run has no size beside " + ", ".join(
                fmt_bytes(b) for b in on_bench) + " to draw its curve from: its reference is "
                "the bench's curve there, measured alone, so the cost also holds what the "
                "run's calls lose beside the compute (an upper bound).")
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
