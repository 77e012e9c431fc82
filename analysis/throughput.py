"""Throughput: per-step communication vs step time and images/sec.

Steps come from APP_STEP rows (op ``step``: t_start_ns..t_end_ns is the step,
``count`` the images this rank processed, the step number in ``step``, else
``seq``).  Each communication call is assigned to the step window of its rank
that contains its start (so the analysis does not depend on who filled the
``step`` column); calls outside every window belong to no step.

Exposed communication -- the definition used here.  On CPU Horovod the
background thread communicates while the main thread still computes the
backward pass; the profiler sees the communication intervals and the step
boundaries but not the main thread's compute, so exposure cannot be observed
directly.  What is observable is the *shape* of a step's data traffic: while
gradients trickle in, the background thread's data calls are separated by idle
gaps (it sleeps for the rest of its cycle, HOROVOD_CYCLE_TIME, default 1 ms,
until the next tensor is ready); once the backward pass is over the main
thread blocks in synchronize and the remaining allreduces run back to back.

* ``comm_union``: length of the union of the rank's data-call intervals inside
  the step window (every thread; intervals clipped to the window).  Upper bound
  of exposed communication (nothing overlapped).
* ``exposed``: the part of that union in the step's final burst -- the merged
  intervals after the last idle gap of at least ``gap_ns`` (default 0.5 ms,
  half the default cycle time).  This is the communication the step end waits
  for; an estimate, exact when compute and the trickle phase are separated by
  such a gap, and equal to comm_union when the traffic never pauses.

Control calls (Horovod's per-cycle negotiation) are counted in comm time by
kind but never in the union or exposure: they run every cycle even when idle.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from profiler.formats import steps as step_figures

from ._frame import call_mask, distinct, isin, label_keys, require

__all__ = ["steps", "rank_steps", "step_table", "steady_steps",
           "run_totals", "run_images_per_s", "run_step_ms", "throughput_summary",
           "correlation", "MIN_STEPS_FOR_CORRELATION"]

MIN_STEPS_FOR_CORRELATION = 10
DEFAULT_GAP_NS = 500_000


def steps(df: pd.DataFrame) -> pd.DataFrame:
    """The APP_STEP rows: [label], rank, step, t_start_ns, t_end_ns, images."""
    require(df, ["op", "rank", "t_start_ns", "t_end_ns", "count"], "steps")
    keys = label_keys(df)
    mask = isin(df["op"], ["step"])
    if "backend" in df.columns:
        mask = mask & isin(df["backend"], ["app"])
    s = df.loc[mask]
    if "step" in s.columns and (s["step"].to_numpy() >= 0).all():
        num = s["step"].to_numpy(dtype=np.int64)
    else:
        num = s["seq"].to_numpy(dtype=np.int64) if "seq" in s.columns else np.arange(len(s))
    out = pd.DataFrame({
        **{k: s[k].astype(str).to_numpy() for k in keys},
        "rank": s["rank"].to_numpy(dtype=np.int64),
        "step": num,
        "t_start_ns": s["t_start_ns"].to_numpy(dtype=np.int64),
        "t_end_ns": s["t_end_ns"].to_numpy(dtype=np.int64),
        "images": s["count"].to_numpy(dtype=np.int64),
    })
    return out.sort_values([*keys, "rank", "t_start_ns"]).reset_index(drop=True)


def _label_codes(col: pd.Series, labels: list[str]) -> np.ndarray:
    """Index of each row's label in `labels` (-1 when absent), without per-row strings."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        pos = {lb: i for i, lb in enumerate(labels)}
        table = np.array([pos.get(str(c), -1) for c in col.cat.categories] + [-1],
                         dtype=np.int64)
        return table[col.cat.codes.to_numpy()]  # code -1 -> last entry (-1)
    return pd.Categorical(col.astype(str), categories=labels).codes.astype(np.int64)


def _assign(st: pd.DataFrame, cl: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """Index into `st` of the step window (same label and rank) holding each call's
    start, -1 if none."""
    out = np.full(len(cl), -1, dtype=np.int64)
    if cl.empty or st.empty:
        return out
    # one integer per (label, rank): label index x (max rank + 1) + rank
    width = int(max(st["rank"].max(), cl["rank"].max())) + 1
    scode = st["rank"].to_numpy(dtype=np.int64)
    ccode = cl["rank"].to_numpy(dtype=np.int64)
    if keys:
        labels = distinct(st["label"])
        scode = scode + width * _label_codes(st["label"], labels)
        ccode = ccode + width * _label_codes(cl["label"], labels)
    s_t0 = st["t_start_ns"].to_numpy(dtype=np.int64)
    s_t1 = st["t_end_ns"].to_numpy(dtype=np.int64)
    c_t0 = cl["t_start_ns"].to_numpy(dtype=np.int64)
    s_order = np.lexsort((s_t0, scode))
    c_order = (np.arange(ccode.size) if (np.diff(ccode) >= 0).all()  # rows come by rank
               else np.argsort(ccode, kind="stable"))
    c_sorted = ccode[c_order]
    s_sorted = scode[s_order]
    for code in np.unique(scode):
        srows = s_order[np.searchsorted(s_sorted, code, "left"):
                        np.searchsorted(s_sorted, code, "right")]
        cpos = c_order[np.searchsorted(c_sorted, code, "left"):
                       np.searchsorted(c_sorted, code, "right")]
        if cpos.size == 0:
            continue
        starts = s_t0[srows]
        j = np.searchsorted(starts, c_t0[cpos], side="right") - 1
        ok = (j >= 0) & (c_t0[cpos] < s_t1[srows[np.maximum(j, 0)]])
        out[cpos[ok]] = srows[j[ok]]
    return out


def _union_and_tail(sid: np.ndarray, t0: np.ndarray, t1: np.ndarray, n_steps: int,
                    gap_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step id: union length of intervals, and length of the final burst."""
    union = np.zeros(n_steps, dtype=np.int64)
    tail = np.zeros(n_steps, dtype=np.int64)
    if sid.size == 0:
        return union, tail
    d_sid, d_t0 = np.diff(sid), np.diff(t0)
    if not ((d_sid > 0) | ((d_sid == 0) & (d_t0 >= 0))).all():  # rows come time-sorted
        order = np.lexsort((t0, sid))
        sid, t0, t1 = sid[order], t0[order], t1[order]
    # merge overlapping intervals within a step: a new block starts when the interval
    # begins after the running maximum end of the previous ones of the same step
    run_end = pd.Series(t1).groupby(sid).cummax().to_numpy()
    prev_end = np.empty_like(run_end)
    prev_end[0] = 0
    prev_end[1:] = run_end[:-1]
    new_block = np.ones(sid.size, dtype=bool)
    new_block[1:] = (sid[1:] != sid[:-1]) | (t0[1:] > prev_end[1:])
    # rows are sorted by (step, start): a block's first row has its earliest
    # start, its last row the running maximum end
    first = np.flatnonzero(new_block)
    last = np.r_[first[1:], sid.size] - 1
    nb = first.size
    b_start = t0[first]
    b_end = run_end[last]
    b_sid = sid[first]
    length = b_end - b_start
    union += np.bincount(b_sid, weights=length, minlength=n_steps).astype(np.int64)
    # the final burst: blocks after the last gap >= gap_ns within the step
    gap_before = np.empty(nb, dtype=np.int64)
    gap_before[0] = np.iinfo(np.int64).max
    gap_before[1:] = b_start[1:] - b_end[:-1]
    first_of_step = np.ones(nb, dtype=bool)
    first_of_step[1:] = b_sid[1:] != b_sid[:-1]
    gap_before[first_of_step] = np.iinfo(np.int64).max
    cut = gap_before >= gap_ns  # a burst starts here
    burst = np.cumsum(cut) - 1
    last_burst = np.full(n_steps, -1, dtype=np.int64)
    np.maximum.at(last_burst, b_sid, burst)
    in_tail = burst == last_burst[b_sid]
    tail += np.bincount(b_sid[in_tail], weights=length[in_tail],
                        minlength=n_steps).astype(np.int64)
    return union, tail


def rank_steps(df: pd.DataFrame, *, gap_ns: int = DEFAULT_GAP_NS) -> pd.DataFrame:
    """One row per rank and step.

    Columns: [label], rank, step, t_start_ns, t_end_ns, wall_ms, images,
    images_per_s, calls, data_calls, control_calls, comm_ms (all calls' time),
    data_ms, control_ms, comm_union_ms, exposed_ms, bytes (data)."""
    st = steps(df)
    keys = label_keys(df)
    # every row is placed in its step (no copy of the frame), then the calls
    # inside a step are taken once, column by column
    sid = _assign(st, df, keys)
    inside = call_mask(df, kinds=None) & (sid >= 0)
    s_ix = sid[inside]
    if "kind" in df.columns:
        is_data = isin(df["kind"], ["data"])[inside]
        is_ctrl = isin(df["kind"], ["control"])[inside]
    else:
        is_data = np.ones(len(s_ix), bool)
        is_ctrl = np.zeros(len(s_ix), bool)

    def col(name: str) -> np.ndarray:
        return df[name].to_numpy(dtype=np.int64)[inside]

    n = len(st)
    dur = col("dur_ns").astype(np.float64)
    c_t0, c_t1 = col("t_start_ns"), col("t_end_ns")

    def per_step(values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        if mask is None:
            return np.bincount(s_ix, weights=values, minlength=n).astype(np.float64)
        return np.bincount(s_ix[mask], weights=values[mask], minlength=n).astype(np.float64)

    out = st.copy()
    wall = (st["t_end_ns"] - st["t_start_ns"]).to_numpy(dtype=np.float64)
    out["wall_ms"] = wall / 1e6
    out["images_per_s"] = np.where(wall > 0, st["images"].to_numpy() / np.where(
        wall > 0, wall, 1.0) * 1e9, np.nan)
    out["calls"] = np.bincount(s_ix, minlength=n).astype(np.int64)
    out["data_calls"] = np.bincount(s_ix[is_data], minlength=n).astype(np.int64)
    out["control_calls"] = np.bincount(s_ix[is_ctrl], minlength=n).astype(np.int64)
    out["comm_ms"] = per_step(dur) / 1e6
    out["data_ms"] = per_step(dur, is_data) / 1e6
    out["control_ms"] = per_step(dur, is_ctrl) / 1e6
    s_start = st["t_start_ns"].to_numpy()
    s_end = st["t_end_ns"].to_numpy()
    d_sid = s_ix[is_data]
    t0 = np.maximum(c_t0[is_data], s_start[d_sid])
    t1 = np.minimum(c_t1[is_data], s_end[d_sid])
    union, tail = _union_and_tail(d_sid, t0, np.maximum(t1, t0), n, gap_ns)
    out["comm_union_ms"] = union / 1e6
    out["exposed_ms"] = tail / 1e6
    out["bytes"] = per_step(col("bytes").astype(np.float64), is_data).astype(np.int64)
    return out


def step_table(df: pd.DataFrame, *, gap_ns: int = DEFAULT_GAP_NS,
               ranked: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per step of the job (ranks combined): its window t_start_ns..t_end_ns
    from the earliest rank's start to the latest rank's end, wall_ms = the ranks'
    own step times averaged (not the window: where the ranks' step boundaries are
    skewed the window is longer than any rank's step by the skew, and a run of
    back-to-back steps would read long by it every step), images summed over
    ranks, images_per_s = images / wall, rank_ns = the ranks' own step times
    summed (ns: what the run's figures come from, run_totals), and the per-rank
    communication figures averaged over ranks (comm_ms, data_ms, control_ms,
    comm_union_ms, exposed_ms, calls, data_calls, bytes).

    Columns: [label], step, ranks, t_start_ns, t_end_ns, wall_ms, images,
    images_per_s, rank_ns, calls, data_calls, control_calls, comm_ms, data_ms, control_ms,
    comm_union_ms, exposed_ms, bytes."""
    rs = ranked if ranked is not None else rank_steps(df, gap_ns=gap_ns)
    keys = label_keys(rs)
    mean_cols = ["calls", "data_calls", "control_calls", "comm_ms", "data_ms", "control_ms",
                 "comm_union_ms", "exposed_ms", "bytes"]
    cols = [*keys, "step", "ranks", "t_start_ns", "t_end_ns", "wall_ms", "images",
            "images_per_s", "rank_ns", *mean_cols]
    if rs.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    rs = rs.assign(rank_ns=np.maximum(rs["t_end_ns"].to_numpy(dtype=np.int64)
                                      - rs["t_start_ns"].to_numpy(dtype=np.int64), 0))
    g = rs.groupby([*keys, "step"], sort=True)
    out = g.agg(ranks=("rank", "nunique"), t_start_ns=("t_start_ns", "min"),
                t_end_ns=("t_end_ns", "max"), images=("images", "sum"),
                wall_ms=("wall_ms", "mean"), rank_ns=("rank_ns", "sum"),
                **{c: (c, "mean") for c in mean_cols}).reset_index()
    wall = out["wall_ms"].to_numpy(dtype=np.float64) * 1e6
    out["images_per_s"] = np.where(wall > 0, out["images"] / np.where(wall > 0, wall, 1) * 1e9,
                                   np.nan)
    for c in ("calls", "data_calls", "control_calls", "bytes"):
        out[c] = out[c].round().astype(np.int64)
    out["rank_ns"] = out["rank_ns"].astype(np.int64)
    out["ranks"] = out["ranks"].astype(np.int64)
    return out[cols]


def run_totals(table: pd.DataFrame) -> step_figures.StepTotals:
    """The integers a run's step time and images/sec come from
    (profiler.formats.steps), over these steps of its step table (step_table;
    usually its steady steps)."""
    if not len(table):
        return step_figures.StepTotals()
    if "rank_ns" in table.columns:
        rank_ns = int(table["rank_ns"].to_numpy(dtype=np.int64).sum())
    else:  # a step table from before rank_ns: the ranks' mean step time x ranks
        rank_ns = int(round(float((table["wall_ms"] * 1e6 * table["ranks"]).sum())))
    return step_figures.StepTotals(
        images=int(table["images"].to_numpy(dtype=np.int64).sum()), rank_ns=rank_ns,
        rank_steps=int(table["ranks"].to_numpy(dtype=np.int64).sum()), steps=len(table))


def run_images_per_s(table: pd.DataFrame) -> float:
    """Images/sec of a run over these steps of its step table: the one
    definition (profiler.formats.steps.images_per_s), which trace.json's
    metadata and the watcher give too.  nan without steps or time."""
    return step_figures.images_per_s(run_totals(table))


def run_step_ms(table: pd.DataFrame) -> float:
    """Step time (ms) of a run over these steps of its step table: the ranks'
    own step times averaged (profiler.formats.steps.step_ms).  nan without
    steps."""
    return step_figures.step_ms(run_totals(table))


def steady_steps(table: pd.DataFrame, warmup: int = step_figures.WARMUP_STEPS
                 ) -> pd.DataFrame:
    """The steps that count for throughput, of one label's step table
    (profiler.formats.steps.steady_mask: the steps with images when the
    application marked its warm-up with 0 images, else all but the first
    ``warmup``)."""
    sub = table.sort_values("step")
    if not len(sub):
        return sub
    return sub.loc[step_figures.steady_mask(sub["step"].to_numpy(), sub["images"].to_numpy(),
                                            warmup)]


def throughput_summary(df: pd.DataFrame | None = None, *, table: pd.DataFrame | None = None,
                       warmup: int = step_figures.WARMUP_STEPS,
                       gap_ns: int = DEFAULT_GAP_NS) -> pd.DataFrame:
    """Per label, over the steady steps (:func:`steady_steps`): steps, ranks,
    the step time (run_step_ms: step_ms_mean, the figure of every door), the
    median of the steps' times (labelled as such), images/sec
    (run_images_per_s), communication, exposed communication and their share of
    the step.

    Columns: [label], steps, ranks, step_ms_median, step_ms_mean, step_ms_std,
    images_per_s, comm_ms, exposed_ms, comm_union_ms, comm_share, exposed_share,
    data_calls_per_step, control_calls_per_step, bytes_per_step."""
    if table is None:
        if df is None:
            from profiler.errors import UsageError

            raise UsageError(None, "throughput_summary: pass a trace frame or a step table")
        table = step_table(df, gap_ns=gap_ns)
    keys = label_keys(table)
    cols = [*keys, "steps", "ranks", "step_ms_median", "step_ms_mean", "step_ms_std",
            "images_per_s", "comm_ms", "exposed_ms", "comm_union_ms", "comm_share",
            "exposed_share", "data_calls_per_step", "control_calls_per_step",
            "bytes_per_step"]
    rows = []
    groups = table.groupby(keys, sort=True) if keys else [((), table)]
    for key, sub in groups:
        sub = steady_steps(sub, warmup)
        wall = float(sub["wall_ms"].sum())
        row: dict[str, object] = {}
        if keys:
            row["label"] = key[0] if isinstance(key, tuple) else key
        row.update(
            steps=len(sub), ranks=int(sub["ranks"].max()) if len(sub) else 0,
            step_ms_median=float(sub["wall_ms"].median()),
            step_ms_mean=run_step_ms(sub),
            step_ms_std=float(sub["wall_ms"].std(ddof=1)) if len(sub) > 1 else float("nan"),
            images_per_s=run_images_per_s(sub),
            comm_ms=float(sub["comm_ms"].mean()), exposed_ms=float(sub["exposed_ms"].mean()),
            comm_union_ms=float(sub["comm_union_ms"].mean()),
            comm_share=float(sub["comm_union_ms"].sum()) / wall if wall > 0 else float("nan"),
            exposed_share=float(sub["exposed_ms"].sum()) / wall if wall > 0 else float("nan"),
            data_calls_per_step=float(sub["data_calls"].mean()),
            control_calls_per_step=float(sub["control_calls"].mean()),
            bytes_per_step=float(sub["bytes"].mean()),
        )
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def _ranks(v: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), 1-based."""
    return pd.Series(v).rank(method="average").to_numpy()


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if a.size < 2 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def correlation(
    df: pd.DataFrame | None = None,
    *,
    table: pd.DataFrame | None = None,
    x: str = "comm_ms",
    y: str = "wall_ms",
    warmup: int = step_figures.WARMUP_STEPS,
    min_steps: int = MIN_STEPS_FOR_CORRELATION,
    warn: bool = True,
) -> pd.DataFrame:
    """Correlation of per-step communication time (x) with step time (y), per label:
    Pearson and Spearman coefficients, the slope (ms of y per ms of x) and a caveat
    in ``note`` (also emitted as a warning) when there are fewer than ``min_steps``
    steady steps (:func:`steady_steps`).

    Columns: [label], steps, x, y, pearson, spearman, slope, note."""
    if table is None:
        if df is None:
            from profiler.errors import UsageError

            raise UsageError(None, "correlation: pass a trace frame or a step table")
        table = step_table(df)
    keys = label_keys(table)
    rows = []
    groups = table.groupby(keys, sort=True) if keys else [((), table)]
    for key, sub in groups:
        sub = steady_steps(sub, warmup)
        a = sub[x].to_numpy(dtype=float)
        b = sub[y].to_numpy(dtype=float)
        n = int(a.size)
        slope = (float(np.polyfit(a, b, 1)[0]) if n >= 2 and np.std(a) > 0 else float("nan"))
        note = ""
        name = (key[0] if isinstance(key, tuple) else key) if keys else None
        if n < min_steps:
            note = (f"only {n} step(s){' in ' + str(name) if name is not None else ''}: "
                    f"correlation is not meaningful below {min_steps} steps")
            if warn:
                warnings.warn(note, stacklevel=2)
        row: dict[str, object] = {"label": name} if keys else {}
        row.update(steps=n, x=x, y=y, pearson=_pearson(a, b),
                   spearman=_pearson(_ranks(a), _ranks(b)) if n >= 2 else float("nan"),
                   slope=slope if not math.isnan(slope) else float("nan"), note=note)
        rows.append(row)
    return pd.DataFrame(rows, columns=[*keys, "steps", "x", "y", "pearson", "spearman",
                                       "slope", "note"])

