"""Compare traces (fusion on/off, two interconnects, 1 vs 2 ranks): the engine of
`profiler compare`.

Input: one frame holding several traces told apart by ``label`` (``load(a, b)``).
A side is one configuration: one trace, or with ``runs`` ({side: [labels]})
several traces of it, its repetitions.  Each side is compared with a baseline
(the first unless named) on:

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

Noise.  Two runs of one configuration differ by more than their steps'
spread: the machine drifts from run to run.  A difference is therefore judged
against the variation between runs, which only repetitions measure:

* several runs a side (``runs``): each run gives one value per metric (its
  steady steps' mean, its images over the time its steps cover, its calls' mean
  or p99 latency), a side's value is the mean of its runs', and the test is
  Welch's t on the run values (scipy.stats.ttest_ind, equal_var=False; test
  "welch-runs"), or with ``paired`` (the runs alternated A B A B ..., run i of
  each side next to each other) Student's t on the pairs' differences
  (scipy.stats.ttest_rel; "paired-runs").  The interval is the test's 95%
  confidence interval of the difference; significant when it excludes 0.
* one run a side: the interval is the 95% bootstrap interval over the run's
  own samples (steps, or calls: at most ``max_samples`` per side, drawn at
  random), with Welch's p over steps for per-step means (test "within-run").
  It bounds the within-run noise only, so a difference inside it is not
  significant (False: adding the run-to-run variation widens it), and one
  outside it is not called either (None: run-to-run variation unknown).

The ``reason`` column says which case applied.  Totals without a sampling
unit (calls per bucket) get an interval only from several runs a side.  The
bootstrap is analysis.stats.bootstrap_interval with its one seed: results are
reproducible.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiler.errors import UsageError
from profiler.formats import steps as step_figures
from profiler.formats.steps import StepTotals

from ._frame import distinct, isin, keys_of, pow2_bucket, timed_calls
from .cycles import CycleEdge, cycle_edge
from .stats import N_BOOT, SEED, bootstrap_interval
from .throughput import steady_steps, step_table

__all__ = ["compare", "welch", "run_test", "RunTest", "STEP_METRICS", "COLUMNS", "LEVEL",
           "WITHIN_RUN", "WELCH_RUNS", "PAIRED_RUNS"]

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
#: The table's columns; test, reason, runs and runs_baseline came last, after n_baseline.
COLUMNS = ["label", "baseline", "metric", "bucket", "value", "baseline_value", "diff",
           "rel_diff", "ci_low", "ci_high", "p_value", "significant", "n", "n_baseline",
           "test", "reason", "runs", "runs_baseline"]

#: The confidence level of every interval (significant: the interval excludes 0).
LEVEL = 0.95
#: The `test` column: what the interval and p-value come from.
WITHIN_RUN = "within-run"    # bootstrap over one run's steps or calls
WELCH_RUNS = "welch-runs"    # Welch's t over run values
PAIRED_RUNS = "paired-runs"  # Student's t over paired runs' differences

#: stat(samples, axis=-1): a metric of samples along the last axis.
Stat = Callable[..., np.ndarray]


# ------------------------------------------------------------------- statistics


def _flat(x: np.ndarray) -> bool:
    """Every value the same, to rounding (a sum of floats can differ in the last bit)."""
    return bool(np.all(np.abs(x - x[0]) <= 1e-12 * max(float(np.abs(x).max()), 1e-300)))


def _scipy(test: Callable[..., Any], *args: Any) -> Any:
    """A scipy.stats test without its precision warnings on near-constant samples
    (_flat catches the constant ones; the CLI turns warnings into lines)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return test(*args)


def welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """Welch's t-test of mean(a) - mean(b) (scipy.stats.ttest_ind, equal_var=False):
    (t, degrees of freedom, two-sided p); NaN with fewer than 2 values a side.
    Both sides constant: p is 0 when the means differ, else 1."""
    from scipy import stats

    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return float("nan"), float("nan"), float("nan")
    if _flat(a) and _flat(b):
        diff = 0.0 if _flat(np.concatenate([a, b])) else float(a.mean() - b.mean())
        return (math.copysign(math.inf, diff) if diff else 0.0), float("nan"), \
            (0.0 if diff else 1.0)
    r = _scipy(lambda x, y: stats.ttest_ind(x, y, equal_var=False), a, b)
    return float(r.statistic), float(r.df), float(r.pvalue)


@dataclass(frozen=True)
class RunTest:
    """A difference of run-level values, its interval (LEVEL) and two-sided p."""

    test: str
    diff: float
    ci_low: float
    ci_high: float
    p_value: float

    @property
    def significant(self) -> bool:
        return bool(self.ci_low > 0 or self.ci_high < 0)


def run_test(a: np.ndarray, b: np.ndarray, *, paired: bool = False,
             level: float = LEVEL) -> RunTest | None:
    """mean(a) - mean(b) over run values (one per run) against the runs' spread:
    Welch's t (scipy.stats.ttest_ind, equal_var=False), or paired (a[i] ran next
    to b[i]) Student's t on the differences (scipy.stats.ttest_rel).  None with
    fewer than 2 runs (pairs) a side.  No spread at all: the interval is the
    difference itself (every run agrees)."""
    from scipy import stats

    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if paired:
        if a.size != b.size:
            raise ValueError("paired runs: the sides need as many runs")
        if a.size < 2:
            return None
        diff = float((a - b).mean())
        if _flat(a - b):
            diff = 0.0 if np.allclose(a, b, rtol=1e-12, atol=0) else diff
            return RunTest(PAIRED_RUNS, diff, diff, diff, 0.0 if diff else 1.0)
        r = _scipy(stats.ttest_rel, a, b)
        test = PAIRED_RUNS
    else:
        if a.size < 2 or b.size < 2:
            return None
        diff = float(a.mean() - b.mean())
        if _flat(a) and _flat(b):
            diff = 0.0 if _flat(np.concatenate([a, b])) else diff
            return RunTest(WELCH_RUNS, diff, diff, diff, 0.0 if diff else 1.0)
        r = _scipy(lambda x, y: stats.ttest_ind(x, y, equal_var=False), a, b)
        test = WELCH_RUNS
    ci = _scipy(lambda: r.confidence_interval(confidence_level=level))
    return RunTest(test, diff, float(ci.low), float(ci.high), float(r.pvalue))


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(np.mean(x, axis=axis))


def _p99(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(np.quantile(x, 0.99, axis=axis))


# ---------------------------------------------------------------------- compare


def _sides(df: pd.DataFrame, labels: Sequence[str] | None, baseline: str | None,
           runs: Mapping[str, Sequence[str]] | None) -> tuple[dict[str, list[str]], str]:
    """{side: its runs' labels} in order, and the baseline side."""
    if "label" not in df.columns:
        raise UsageError(None, "compare needs several traces: load them together, "
                               "e.g. load(a, b) (a label column)")
    present = distinct(df["label"])
    if runs is None:
        sides = {x: [x] for x in present}
    else:
        sides = {str(k): [str(x) for x in v] for k, v in runs.items()}
        traces = [x for v in sides.values() for x in v]
        missing = [x for x in traces if x not in present]
        if missing:
            raise UsageError(None, f"runs: unknown trace label(s) {', '.join(missing)}; "
                                   f"the traces are {', '.join(present)}")
        if len(set(traces)) != len(traces):
            raise UsageError(None, "runs: a trace is a run of one side only")
        empty = [k for k, v in sides.items() if not v]
        if empty:
            raise UsageError(None, f"runs: side(s) {', '.join(empty)} without a trace")
    names = list(sides)
    chosen = list(labels) if labels is not None else names
    unknown = [x for x in chosen + ([baseline] if baseline else []) if x not in sides]
    if unknown:
        raise UsageError(None, f"unknown label(s) {', '.join(unknown)}; the traces are "
                               f"{', '.join(names)}")
    if len(chosen) < 2:
        raise UsageError(None, "compare needs at least two traces")
    base = baseline or chosen[0]
    return {x: sides[x] for x in dict.fromkeys(chosen + [base])}, base


def _nan() -> float:
    return float("nan")


def _row(label: str, base: str, metric: str, bucket: str, a: Sequence[np.ndarray],
         b: Sequence[np.ndarray], stat: Stat, *, paired: bool, n_boot: int, seed: int,
         welch_p: bool = False, p_samples: tuple[np.ndarray, np.ndarray] | None = None
         ) -> dict[str, object]:
    """One row: a and b hold each run's samples (steps, calls, or one value per
    run for a count), aligned by run; an empty array is a run without any.
    Two runs a side or more: run_test on stat of each run; fewer: the
    bootstrap of stat over the pooled samples, which bounds within-run noise
    only (module doc).  welch_p: Welch's p over the pooled samples (or
    p_samples) in that case."""
    ra = [x for x in a if x.size]
    rb = [x for x in b if x.size]
    t: RunTest | None = None
    if len(ra) >= 2 and len(rb) >= 2:
        if paired:
            pairs = [(float(stat(x)), float(stat(y))) for x, y in zip(a, b) if x.size and y.size]
            if len(pairs) >= 2:
                t = run_test(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]),
                             paired=True)
        if t is None:
            t = run_test(np.array([float(stat(x)) for x in ra]),
                         np.array([float(stat(x)) for x in rb]))
    if t is not None:
        value = float(np.mean([float(stat(x)) for x in ra]))
        base_value = float(np.mean([float(stat(x)) for x in rb]))
        lo, hi, p = t.ci_low, t.ci_high, t.p_value
        sig: bool | None = t.significant
        test = t.test
        reason = ("the runs differ beyond their spread" if sig
                  else "within the run-to-run spread")
    else:
        pa = np.concatenate(ra) if ra else np.array([])
        pb = np.concatenate(rb) if rb else np.array([])
        value = float(stat(pa)) if pa.size else _nan()
        base_value = float(stat(pb)) if pb.size else _nan()

        def delta(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
            return np.asarray(stat(x, axis=axis) - stat(y, axis=axis))

        if pa.size >= 2 and pb.size >= 2 and _flat(np.concatenate([pa, pb])):
            lo = hi = 0.0  # one value throughout (to rounding): no difference at all
        else:
            lo, hi = bootstrap_interval((pa, pb), delta, n=n_boot, seed=seed)
        p = welch(*(p_samples or (pa, pb)))[2] if welch_p else _nan()
        test = WITHIN_RUN
        unknown = ("run-to-run variation unknown (one run per side)"
                   if len(ra) <= 1 and len(rb) <= 1 else
                   "run-to-run variation unknown (fewer than 2 runs on a side)")
        if math.isnan(lo) or math.isnan(hi):
            sig, test = None, ""
            reason = (f"no interval: one value per run; {unknown}"
                      if all(x.size == 1 for x in ra + rb) else "too few samples for an interval")
        elif lo > 0 or hi < 0:
            sig, reason = None, unknown
        else:  # the run-to-run variation would only widen the interval
            sig, reason = False, "within the within-run noise"
    diff = value - base_value
    return {"label": label, "baseline": base, "metric": metric, "bucket": bucket,
            "value": value, "baseline_value": base_value, "diff": diff,
            "rel_diff": (diff / base_value if base_value != 0.0 and not math.isnan(base_value)
                         else _nan()),
            "ci_low": lo, "ci_high": hi, "p_value": p, "significant": sig,
            "n": int(sum(x.size for x in ra)), "n_baseline": int(sum(x.size for x in rb)),
            "test": test, "reason": reason, "runs": len(ra), "runs_baseline": len(rb)}


def _run_row(label: str, base: str, metric: str, a: Sequence[pd.DataFrame],
             b: Sequence[pd.DataFrame], **kw: Any) -> dict[str, object]:
    """step_ms or images_per_s: a run's figure over its steady steps, the one
    definition (profiler.formats.steps, through throughput.run_totals: the
    figure summarize, advise and trace.json give); the samples are step indices
    into every run's steps, so the within-run bootstrap resamples steps of that
    ratio, and Welch's p there is over each step's own value."""
    tables = [*a, *b]
    starts = np.cumsum([0] + [len(t) for t in tables])
    ix = [np.arange(starts[i], starts[i + 1], dtype=float) for i in range(len(tables))]
    steps = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    images = steps["images"].to_numpy(dtype=np.int64) if len(steps) else np.zeros(0, np.int64)
    ranks = steps["ranks"].to_numpy(dtype=np.int64) if len(steps) else np.zeros(0, np.int64)
    rank_ns = (steps["rank_ns"].to_numpy(dtype=np.int64) if len(steps) and "rank_ns"
               in steps.columns else np.zeros(len(steps), np.int64))

    def figure(x: np.ndarray, axis: int = -1) -> np.ndarray:
        k = np.asarray(x).astype(np.int64)
        if k.ndim == 1:  # a run's (or the pooled runs') own figure: exactly as everywhere
            t = StepTotals(images=int(images[k].sum()), rank_ns=int(rank_ns[k].sum()),
                           rank_steps=int(ranks[k].sum()), steps=int(k.size))
            return np.asarray(step_figures.step_ms(t) if metric == "step_ms"
                              else step_figures.images_per_s(t))
        ns = rank_ns[k].sum(axis=axis).astype(float)
        rs = ranks[k].sum(axis=axis).astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            if metric == "step_ms":
                return np.asarray(np.where(rs > 0, ns / rs / 1e6, np.nan))
            n = float(k.shape[axis])
            im = images[k].sum(axis=axis).astype(float)
            return np.asarray(np.where(ns > 0, im * rs * 1e9 / (n * ns), np.nan))

    col = "wall_ms" if metric == "step_ms" else "images_per_s"

    def own(ts: Sequence[pd.DataFrame]) -> np.ndarray:
        r = np.concatenate([t[col].to_numpy(dtype=float) for t in ts]) if ts else np.zeros(0)
        return r[np.isfinite(r)]

    return _row(label, base, metric, "", ix[:len(a)], ix[len(a):], figure,
                welch_p=True, p_samples=(own(a), own(b)), **kw)


def _breakdown(df: pd.DataFrame, label: str) -> pd.DataFrame | None:
    """One trace's rank breakdown (None when the trace has none)."""
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


def _finite(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return x[np.isfinite(x)]


def compare(
    df: pd.DataFrame,
    *,
    labels: Sequence[str] | None = None,
    baseline: str | None = None,
    runs: Mapping[str, Sequence[str]] | None = None,
    paired: bool = False,
    warmup: int = 1,
    n_boot: int = N_BOOT,
    max_samples: int = 5000,
    seed: int = SEED,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    cycles: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Every side against the baseline; one row per (side, metric, bucket).

    runs: {side: the labels of its traces, its repetitions}; default: each
    label a side of one run.  labels, baseline: side names.  paired: run i of
    each side ran next to run i of the baseline (alternating A B A B ...), so
    the test is on the pairs' differences; the sides then need as many runs.

    Columns (COLUMNS): label (the side), baseline, metric, bucket ("" for
    per-step metrics, else the bucket's upper bound in bytes as text), value,
    baseline_value (a side's value: the mean of its runs'), diff, rel_diff,
    ci_low, ci_high (95% interval of the difference), p_value, significant
    (True/False; None when the data cannot tell: one run a side with a
    difference beyond the within-run noise, or no interval), n, n_baseline
    (samples: steps or calls, over all runs; runs for a count), test
    (WITHIN_RUN, WELCH_RUNS, PAIRED_RUNS or "" for none), reason (the verdict's
    ground in words), runs, runs_baseline.  cycles: each trace label's
    HOROVOD_CYCLE_TIME in ms, for the share of steps a whole cycle late."""
    sides, base = _sides(df, labels, baseline, runs)
    if paired:
        counts = {k: len(v) for k, v in sides.items()}
        if len(set(counts.values())) > 1:
            raise UsageError(None, "paired runs: every side needs as many runs ("
                             + ", ".join(f"{k} {n}" for k, n in counts.items()) + ")")
    traces = [x for v in sides.values() for x in v]
    others = [lb for lb in sides if lb != base]
    side_of = {tr: side for side, v in sides.items() for tr in v}
    kw: dict[str, Any] = {"paired": paired, "n_boot": n_boot, "seed": seed}
    rows: list[dict[str, object]] = []
    # ---- per-step metrics, per run
    st = step_table(df.loc[isin(df["label"], traces)])
    per_step: dict[str, pd.DataFrame] = {}
    n_steps: dict[str, int] = {}
    for tr in traces:
        sub = st.loc[st["label"].astype(str) == tr].sort_values("step") if len(st) else st
        n_steps[tr] = len(sub)
        per_step[tr] = steady_steps(sub, warmup) if len(sub) else sub
    has_steps = all(len(per_step[tr]) > 0 for tr in traces)

    def samples(side: str, get: Callable[[str], np.ndarray | None]) -> list[np.ndarray]:
        out = []
        for tr in sides[side]:
            v = get(tr)
            out.append(np.array([]) if v is None else _finite(v))
        return out

    if has_steps:
        for lb in others:
            for col, metric in STEP_METRICS.items():
                if metric in ("step_ms", "images_per_s"):
                    rows.append(_run_row(lb, base, metric, [per_step[t] for t in sides[lb]],
                                         [per_step[t] for t in sides[base]], **kw))
                    continue

                def get(tr: str, col: str = col) -> np.ndarray:
                    return per_step[tr][col].to_numpy(dtype=float)

                rows.append(_row(lb, base, metric, "", samples(lb, get), samples(base, get),
                                 _mean, welch_p=True, **kw))
        bds = {tr: _breakdown(df, tr) for tr in traces}
        parts = {tr: _parts(bds[tr], per_step[tr]["step"]) for tr in traces}
        edges = {tr: _edge(bds[tr], per_step[tr]["step"], (cycles or {}).get(tr))
                 for tr in traces}

        def waited(tr: str) -> np.ndarray | None:
            e = edges[tr]
            return None if e is None else e.waited.astype(float)

        for lb in others:
            ea = [edges[t] for t in sides[lb] if edges[t] is not None]
            eb = [edges[t] for t in sides[base] if edges[t] is not None]
            if ea and eb and any(e.passed for e in ea + eb):  # type: ignore[union-attr]
                rows.append(_row(lb, base, "second_cycle_share", "", samples(lb, waited),
                                 samples(base, waited), _mean, welch_p=True,
                                 **kw))
        if all(p is not None for p in parts.values()):
            for lb in others:
                for col, metric in BREAKDOWN_METRICS.items():
                    def part(tr: str, col: str = col) -> np.ndarray:
                        return parts[tr][col].to_numpy(dtype=float)  # type: ignore[index]

                    rows.append(_row(lb, base, metric, "", samples(lb, part),
                                     samples(base, part), _mean, welch_p=True,
                                     **kw))
    # ---- per size bucket: calls, mean and p99 latency
    tc = timed_calls(df, kinds=kinds, ops=ops)
    tc = tc.loc[isin(tc["label"], traces)]
    work = pd.DataFrame({"label": keys_of(tc["label"]),
                         "bucket": pow2_bucket(tc["bytes"].to_numpy()),
                         "rank": tc["rank"].to_numpy(),
                         "us": tc["dur_ns"].to_numpy(dtype=float) / 1e3})
    buckets = sorted(set(work["bucket"].tolist()))
    groups = {(str(k[0]), k[1]): g for k, g in work.groupby(["label", "bucket"],
                                                            observed=True)}
    lowest = ({str(k): v for k, v in work.groupby("label", observed=True)["rank"].min().items()}
              if len(work) else {})
    rng = np.random.default_rng(seed)  # which calls a big bucket keeps
    for lb in others:
        for bk in buckets:
            def count(tr: str, bk: int = bk) -> np.ndarray:
                g = groups.get((tr, bk))  # calls as one rank makes them
                c = int((g["rank"] == lowest.get(tr)).sum()) if g is not None else 0
                return np.array([c / max(n_steps[tr], 1) if has_steps else float(c)])

            rows.append(_row(lb, base, "calls_per_step" if has_steps else "calls", str(bk),
                             samples(lb, count), samples(base, count), _mean,
                             **kw))

            def lat(tr: str, bk: int = bk) -> np.ndarray | None:
                g = groups.get((tr, bk))
                if g is None:
                    return None
                us = g["us"].to_numpy()
                cap = max(1, max_samples // len(sides[side_of[tr]]))
                return rng.choice(us, cap, replace=False) if us.size > cap else us

            a, b = samples(lb, lat), samples(base, lat)
            if not any(x.size for x in a) or not any(x.size for x in b):
                continue
            rows.append(_row(lb, base, "mean_us", str(bk), a, b, _mean,
                             **kw))
            rows.append(_row(lb, base, "p99_us", str(bk), a, b, _p99,
                             **kw))
    out = pd.DataFrame(rows, columns=COLUMNS)
    # True, False or None: an object column, whatever the rows hold
    out["significant"] = pd.Series([r["significant"] for r in rows], index=out.index,
                                   dtype=object)
    return out
