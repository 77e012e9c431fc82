"""Compare traces (fusion on/off, two interconnects, 1 vs 2 ranks): the engine of
`profiler compare`.

Input: one frame holding several traces told apart by ``label`` (``load(a, b)``).
Each label is compared with a baseline (the first label unless named) on:

* per-step metrics (when the traces mark steps; the steady steps, see
  throughput.steady_steps): step time, images/sec (summarize's figure, the
  run's images over the time its steps cover), communication time, exposed
  communication, data and control calls per step, data bytes per step, and the
  step breakdown's parts (analysis.breakdown, mean over ranks; the profiler's
  own part stays in compute here, the frame carries no self-cost) where both
  traces have one;
* the share of steady steps that waited a whole Horovod cycle (or more) beyond
  the fast ones (analysis.cycles, each trace on its own HOROVOD_CYCLE_TIME,
  from ``cycles``), where the test finds that second peak in either trace;
* per power-of-two size bucket (data calls): calls as the lowest rank makes
  them (divided by the number of steps when steps exist, else in total), mean
  and p99 latency over every rank's calls.

Noise.  A difference is called significant when the 95% bootstrap confidence
interval of (label - baseline) excludes 0: for per-step metrics the resampled
units are steps (run-to-run variation within each trace), for latency the
units are calls (at most ``max_samples`` per side, drawn at random, so big
traces stay fast).  For per-step means the Welch t-test p-value is given too.
Totals without a sampling unit (calls per bucket when there are no steps) get
no interval.  Bootstrap uses a fixed seed: results are reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from profiler.errors import UsageError

from ._frame import distinct, isin, keys_of, pow2_bucket, timed_calls
from .cycles import CycleEdge, cycle_edge
from .throughput import covered_ns, steady_steps, step_table

__all__ = ["compare", "welch", "bootstrap_diff", "STEP_METRICS"]

STEP_METRICS: dict[str, str] = {  # step_table column -> metric name
    "wall_ms": "step_ms",
    "images_per_s": "images_per_s",
    "comm_ms": "comm_ms_per_step",
    "exposed_ms": "exposed_ms_per_step",
    "data_calls": "data_calls_per_step",
    "control_calls": "control_calls_per_step",
    "bytes": "data_bytes_per_step",
}
#: breakdown part -> metric name
BREAKDOWN_METRICS: dict[str, str] = {
    "compute_ms": "compute_ms_per_step", "wait_ranks_ms": "wait_ranks_ms_per_step",
    "horovod_ms": "horovod_ms_per_step", "transfer_ms": "transfer_ms_per_step",
}
COLUMNS = ["label", "baseline", "metric", "bucket", "value", "baseline_value", "diff",
           "rel_diff", "ci_low", "ci_high", "p_value", "significant", "n", "n_baseline"]


# ------------------------------------------------------------------- statistics


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-12:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log(1.0 - x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_sf2(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with df degrees of freedom."""
    if not math.isfinite(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """Welch's t-test of mean(a) - mean(b): (t, degrees of freedom, two-sided p)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return float("nan"), float("nan"), float("nan")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se2 = va + vb
    diff = float(a.mean() - b.mean())
    if se2 == 0:
        return (float("inf") if diff else 0.0), float("nan"), (0.0 if diff else 1.0)
    t = diff / math.sqrt(se2)
    df = se2 * se2 / (va * va / (a.size - 1) + vb * vb / (b.size - 1))
    return t, df, _t_sf2(t, df)


def bootstrap_diff(a: np.ndarray, b: np.ndarray, stat: Callable[[np.ndarray], np.ndarray],
                   *, n_boot: int = 1000, level: float = 0.95,
                   rng: np.random.Generator | None = None) -> tuple[float, float]:
    """Percentile bootstrap interval of stat(a) - stat(b); stat works along axis 1."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return float("nan"), float("nan")
    rng = rng or np.random.default_rng(0)
    ra = a[rng.integers(0, a.size, (n_boot, a.size))]
    rb = b[rng.integers(0, b.size, (n_boot, b.size))]
    d = stat(ra) - stat(rb)
    lo, hi = np.quantile(d, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def _mean(x: np.ndarray) -> np.ndarray:
    return np.asarray(x.mean(axis=1))


def _p99(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.quantile(x, 0.99, axis=1))


# ---------------------------------------------------------------------- compare


def _labels(df: pd.DataFrame, labels: Sequence[str] | None, baseline: str | None
            ) -> tuple[list[str], str]:
    if "label" not in df.columns:
        raise UsageError(None, "compare needs several traces: load them together, "
                               "e.g. load(a, b) (a label column)")
    present = distinct(df["label"])
    chosen = list(labels) if labels is not None else present
    unknown = [x for x in chosen + ([baseline] if baseline else []) if x not in present]
    if unknown:
        raise UsageError(None, f"unknown label(s) {', '.join(unknown)}; the traces are "
                               f"{', '.join(present)}")
    if len(chosen) < 2:
        raise UsageError(None, "compare needs at least two traces")
    base = baseline or chosen[0]
    return chosen, base


def _row(label: str, base: str, metric: str, bucket: str, a: np.ndarray, b: np.ndarray,
         stat: Callable[[np.ndarray], np.ndarray] | None, welch_test: bool,
         rng: np.random.Generator, n_boot: int, value: float | None = None,
         base_value: float | None = None) -> dict[str, object]:
    if value is None:
        value = float(stat(a[None, :])[0]) if (stat and a.size) else float("nan")
    if base_value is None:
        base_value = float(stat(b[None, :])[0]) if (stat and b.size) else float("nan")
    diff = value - base_value
    lo, hi = (bootstrap_diff(a, b, stat, n_boot=n_boot, rng=rng) if stat is not None
              else (float("nan"), float("nan")))
    p = welch(a, b)[2] if welch_test else float("nan")
    sig: object = (bool(lo > 0 or hi < 0) if not (math.isnan(lo) or math.isnan(hi))
                   else None)
    return {"label": label, "baseline": base, "metric": metric, "bucket": bucket,
            "value": value, "baseline_value": base_value, "diff": diff,
            "rel_diff": diff / base_value if base_value not in (0.0,) and
            not math.isnan(base_value) else float("nan"),
            "ci_low": lo, "ci_high": hi, "p_value": p, "significant": sig,
            "n": int(a.size), "n_baseline": int(b.size)}


def _rate_row(label: str, base: str, a: pd.DataFrame, b: pd.DataFrame,
              rng: np.random.Generator, n_boot: int) -> dict[str, object]:
    """images/sec: each run's images over the time its steps cover
    (throughput.run_images_per_s, the figure summarize gives), the interval
    a bootstrap over steps of that ratio; the p-value Welch's on each
    step's own rate."""
    images = np.concatenate([a["images"].to_numpy(dtype=float),
                             b["images"].to_numpy(dtype=float)])
    covered = np.concatenate([covered_ns(a), covered_ns(b)]).astype(float)

    def rate(ix: np.ndarray) -> np.ndarray:  # ix: step indices into both runs' steps
        k = ix.astype(np.int64)
        c = covered[k].sum(axis=-1)
        return np.where(c > 0, images[k].sum(axis=-1) / np.where(c > 0, c, 1.0) * 1e9, np.nan)

    ia = np.arange(len(a), dtype=float)
    row = _row(label, base, "images_per_s", "", ia, len(a) + np.arange(len(b), dtype=float),
               rate, False, rng, n_boot)
    ra, rb = (x["images_per_s"].to_numpy(dtype=float) for x in (a, b))
    row["p_value"] = welch(ra[np.isfinite(ra)], rb[np.isfinite(rb)])[2]
    return row


def _breakdown(df: pd.DataFrame, label: str) -> pd.DataFrame | None:
    """One label's rank breakdown (None when the trace has none)."""
    from .breakdown import rank_breakdown

    bd = rank_breakdown(df.loc[isin(df["label"], [label])].drop(columns=["label"]))
    return None if bd.empty or (bd["source"] == "none").all() else bd


def _parts(bd: pd.DataFrame | None, steps: pd.Series) -> pd.DataFrame | None:
    """Per steady step: the breakdown's parts, mean over ranks."""
    if bd is None:
        return None
    bd = bd.loc[bd["step"].isin(steps)]
    return bd.groupby("step")[list(BREAKDOWN_METRICS)].mean() if len(bd) else None


def _edge(bd: pd.DataFrame | None, steps: pd.Series, cycle: float | None) -> CycleEdge | None:
    """The cycle test on the steady steps timed from synchronize (as the
    finding takes them: wall time, mean over ranks)."""
    if bd is None or not cycle:
        return None
    sync = bd.loc[(bd["source"] == "sync") & bd["step"].isin(steps)]
    return cycle_edge(sync.groupby("step")["wall_ms"].mean().to_numpy(), cycle)


def compare(
    df: pd.DataFrame,
    *,
    labels: Sequence[str] | None = None,
    baseline: str | None = None,
    warmup: int = 1,
    n_boot: int = 1000,
    max_samples: int = 5000,
    seed: int = 0,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    cycles: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Every label against the baseline; one row per (label, metric, bucket).

    Columns: label, baseline, metric, bucket ("" for per-step metrics, else the
    bucket's upper bound in bytes as text), value, baseline_value, diff, rel_diff,
    ci_low, ci_high (95% bootstrap interval of the difference), p_value (Welch,
    per-step metrics), significant (True/False, None when no interval), n,
    n_baseline (samples: steps or calls).  cycles: each label's
    HOROVOD_CYCLE_TIME in ms, for the share of steps a whole cycle late."""
    chosen, base = _labels(df, labels, baseline)
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    # ---- per-step metrics
    st = step_table(df.loc[isin(df["label"], chosen)])
    per_step: dict[str, pd.DataFrame] = {}
    n_steps: dict[str, int] = {}
    for lb in chosen:
        sub = st.loc[st["label"].astype(str) == lb].sort_values("step") if len(st) else st
        n_steps[lb] = len(sub)
        per_step[lb] = steady_steps(sub, warmup) if len(sub) else sub
    has_steps = all(len(per_step[lb]) > 0 for lb in chosen)
    if has_steps:
        for lb in chosen:
            if lb == base:
                continue
            for col, metric in STEP_METRICS.items():
                if col == "images_per_s":
                    rows.append(_rate_row(lb, base, per_step[lb], per_step[base], rng,
                                          n_boot))
                    continue
                a = per_step[lb][col].to_numpy(dtype=float)
                b = per_step[base][col].to_numpy(dtype=float)
                a, b = a[np.isfinite(a)], b[np.isfinite(b)]
                rows.append(_row(lb, base, metric, "", a, b, _mean, True, rng, n_boot))
        bds = {lb: _breakdown(df, lb) for lb in chosen}
        parts = {lb: _parts(bds[lb], per_step[lb]["step"]) for lb in chosen}
        edges = {lb: _edge(bds[lb], per_step[lb]["step"], (cycles or {}).get(lb))
                 for lb in chosen}
        for lb in chosen:
            ea, eb = edges[lb], edges[base]
            if lb != base and ea is not None and eb is not None and (ea.passed or eb.passed):
                rows.append(_row(lb, base, "second_cycle_share", "",
                                 ea.waited.astype(float), eb.waited.astype(float), _mean,
                                 True, rng, n_boot))
        if all(p is not None for p in parts.values()):
            for lb in chosen:
                if lb == base:
                    continue
                for col, metric in BREAKDOWN_METRICS.items():
                    a = parts[lb][col].to_numpy(dtype=float)  # type: ignore[index]
                    b = parts[base][col].to_numpy(dtype=float)  # type: ignore[index]
                    rows.append(_row(lb, base, metric, "", a, b, _mean, True, rng, n_boot))
    # ---- per size bucket: calls, mean and p99 latency
    tc = timed_calls(df, kinds=kinds, ops=ops)
    tc = tc.loc[isin(tc["label"], chosen)]
    work = pd.DataFrame({"label": keys_of(tc["label"]),
                         "bucket": pow2_bucket(tc["bytes"].to_numpy()),
                         "rank": tc["rank"].to_numpy(),
                         "us": tc["dur_ns"].to_numpy(dtype=float) / 1e3})
    if has_steps and "step" in tc.columns:
        work["step"] = tc["step"].to_numpy()
    buckets = sorted(set(work["bucket"].tolist()))
    groups = {(str(k[0]), k[1]): g for k, g in work.groupby(["label", "bucket"],
                                                            observed=True)}
    lowest = ({str(k): v for k, v in work.groupby("label", observed=True)["rank"].min().items()}
              if len(work) else {})
    for lb in chosen:
        if lb == base:
            continue
        for bk in buckets:
            ga = groups.get((lb, bk))
            gb = groups.get((base, bk))
            a = ga["us"].to_numpy() if ga is not None else np.array([])
            b = gb["us"].to_numpy() if gb is not None else np.array([])
            # calls as one rank makes them
            ca = (int((ga["rank"] == lowest.get(lb)).sum()) if ga is not None else 0)
            cb = (int((gb["rank"] == lowest.get(base)).sum()) if gb is not None else 0)
            if has_steps:
                na, nb = n_steps[lb], n_steps[base]
                rows.append(_row(lb, base, "calls_per_step", str(bk), np.array([]), np.array([]),
                                 None, False, rng, n_boot, ca / max(na, 1), cb / max(nb, 1)))
            else:
                rows.append(_row(lb, base, "calls", str(bk), np.array([]), np.array([]), None,
                                 False, rng, n_boot, float(ca), float(cb)))
            if a.size > max_samples:
                a = rng.choice(a, max_samples, replace=False)
            if b.size > max_samples:
                b = rng.choice(b, max_samples, replace=False)
            if a.size == 0 or b.size == 0:
                continue
            rows.append(_row(lb, base, "mean_us", str(bk), a, b, _mean, False, rng, n_boot))
            rows.append(_row(lb, base, "p99_us", str(bk), a, b, _p99, False, rng, n_boot))
    return pd.DataFrame(rows, columns=COLUMNS)
