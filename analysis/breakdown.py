"""Where a training step goes: a per-rank, per-step breakdown whose parts sum to
the step.

A step of rank r runs from its step boundary to the next (APP_STEP rows).  In
a Horovod job the main thread computes (data loading, forward, backward, the
optimizer update), handing gradients to Horovod as they become ready (APP_TENSOR
rows), then blocks in synchronize (the APP_SYNC row, from entering
hvd.DistributedOptimizer's synchronize to its return) until every tensor has
been reduced.  The parts, in milliseconds:

* ``wait_ranks``: time in synchronize before the last rank's last tensor was
  handed to Horovod (``arrival``: the end of a rank's last tensor enqueue in the
  step, or its entry into synchronize when it recorded no tensor).  No
  collective of the step can finish before that, whatever this rank does.
* ``transfer``: the union of this rank's data calls inside synchronize after
  that moment (MPI/NCCL time moving the last gradients).
* ``horovod``: the rest of synchronize up to the end of its last data call:
  Horovod's cycle sleep, negotiation (its control calls, ``negotiation`` of
  it) and fusion-buffer copies; plus ``completion``: from the end of the last
  data call to synchronize's return (copies out, callbacks and the main
  thread's polling for its handles).
* ``profiler``: the profiler's own hooks on the main thread (the trace's
  self-cost, spread evenly over the rank's steps).
* ``compute``: everything outside synchronize (forward, backward, data
  loading, the optimizer update) less the profiler's part.
* ``unexplained``: synchronize time no rule above claims (a window with no data
  call: the step's gradients were reduced before the last rank arrived, or the
  other ranks recorded no such step).

A step that some ranks do not run because they are waiting in ``hvd.join``
(uneven data: "join" rows) is split with the ranks that run it: Horovod does
not wait for a joined rank.  :func:`last_ranks` still takes only the steps
every rank ran (the time in join is findings.join's).

Programs without synchronize (MPI programs calling collectives on the thread
that marks steps) get the same parts from their blocking collectives, matched
across ranks by (communicator, sequence number): ``wait_ranks`` is the time
before the call's last rank arrived, ``transfer`` the rest of the call;
``horovod`` is 0.

By construction the parts of every (rank, step) sum to its wall time exactly;
the job's breakdown is their mean over ranks, which equals the mean compute
plus the load imbalance (last arrival minus mean arrival) plus the parts after
the last arrival.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats.record import LIFECYCLE_OPS

from ._frame import isin

__all__ = ["PARTS", "LABELS", "rank_breakdown", "breakdown_summary", "last_ranks",
           "caused_wait"]

#: The parts of a step, in the order they are shown.
PARTS = ("compute", "wait_ranks", "horovod", "transfer", "profiler", "unexplained")
LABELS = {
    "compute": "compute and the rest",
    "wait_ranks": "waiting for other ranks",
    "horovod": "waiting for Horovod",
    "transfer": "transfer",
    "profiler": "profiler",
    "unexplained": "unexplained",
}

_COLUMNS = ["rank", "step", "t_start_ns", "t_end_ns", "wall_ms", *[f"{p}_ms" for p in PARTS],
            "negotiation_ms", "completion_ms", "arrival_ns", "sync_start_ns", "sync_end_ns",
            "source"]


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object if c == "source" else np.float64)
                         for c in _COLUMNS})


def _app_rows(df: pd.DataFrame, op: str) -> pd.DataFrame:
    mask = isin(df["op"], [op])
    if "backend" in df.columns:
        mask = mask & isin(df["backend"], ["app"])
    return df.loc[mask]


def _steps(df: pd.DataFrame) -> pd.DataFrame:
    s = _app_rows(df, "step")
    num = (s["step"].to_numpy(dtype=np.int64)
           if "step" in s.columns and (s["step"].to_numpy() >= 0).all()
           else s["seq"].to_numpy(dtype=np.int64))
    return pd.DataFrame({"rank": s["rank"].to_numpy(dtype=np.int64), "step": num,
                         "t_start_ns": s["t_start_ns"].to_numpy(dtype=np.int64),
                         "t_end_ns": s["t_end_ns"].to_numpy(dtype=np.int64)})


def _locate(keys_rank: np.ndarray, starts: np.ndarray, ends: np.ndarray,
            rank: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the window (rows sorted by rank, then start) of the same rank
    that holds time t, -1 if none."""
    out = np.full(t.size, -1, dtype=np.int64)
    if t.size == 0 or keys_rank.size == 0:
        return out
    width = int(max(keys_rank.max(), rank.max())) + 1
    # one sorted axis: rank * span + time (times are >= 0 and < 2**62 / width)
    lo = int(min(starts.min(), t.min()))
    span = int(max(ends.max(), t.max())) - lo + 2
    if span * width >= 2 ** 62:  # not representable: per rank
        for r in np.unique(keys_rank):
            w = np.flatnonzero(keys_rank == r)
            c = np.flatnonzero(rank == r)
            j = np.searchsorted(starts[w], t[c], side="right") - 1
            ok = (j >= 0) & (t[c] < ends[w[np.maximum(j, 0)]])
            out[c[ok]] = w[j[ok]]
        return out
    key = keys_rank * span + (starts - lo)
    q = rank * span + (t - lo)
    j = np.searchsorted(key, q, side="right") - 1
    safe = np.maximum(j, 0)
    ok = (j >= 0) & (keys_rank[safe] == rank) & (t < ends[safe])
    out[ok] = j[ok]
    return out


def _in_join(df: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """How many ranks are inside hvd.join ("join" rows) at each time t."""
    j = _app_rows(df, "join")
    if j.empty or t.size == 0:
        return np.zeros(t.size, dtype=np.int64)
    t0 = np.sort(j["t_start_ns"].to_numpy(dtype=np.int64))
    t1 = np.sort(j["t_end_ns"].to_numpy(dtype=np.int64))
    return (np.searchsorted(t0, t, side="right") - np.searchsorted(t1, t, side="left")
            ).astype(np.int64)


def _union(win: np.ndarray, t0: np.ndarray, t1: np.ndarray, n: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """Per window: the length of the union of the intervals, and the latest end
    (-1 where the window has none)."""
    union = np.zeros(n, dtype=np.float64)
    last = np.full(n, -1, dtype=np.int64)
    keep = (win >= 0) & (t1 > t0)
    win, t0, t1 = win[keep], t0[keep], t1[keep]
    if win.size == 0:
        return union, last
    order = np.lexsort((t0, win))
    win, t0, t1 = win[order], t0[order], t1[order]
    run_end = pd.Series(t1).groupby(win).cummax().to_numpy()
    prev = np.empty_like(run_end)
    prev[0] = 0
    prev[1:] = run_end[:-1]
    new = np.ones(win.size, dtype=bool)
    new[1:] = (win[1:] != win[:-1]) | (t0[1:] > prev[1:])
    first = np.flatnonzero(new)
    lastrow = np.r_[first[1:], win.size] - 1
    length = (run_end[lastrow] - t0[first]).astype(np.float64)
    union += np.bincount(win[first], weights=length, minlength=n)
    np.maximum.at(last, win, t1)
    return union, last


def _profiler_ms(meta: Mapping[str, Any] | None, steps: pd.DataFrame) -> pd.Series:
    """ms per step of the profiler's hooks on the main thread, per rank: the
    rank's Python/tensor hook time (self_cost) over its recorded steps."""
    out: dict[int, float] = {}
    sc = (meta or {}).get("self_cost")
    counts = steps.groupby("rank")["step"].nunique() if len(steps) else pd.Series(dtype=int)
    if isinstance(sc, dict):
        for r in sc.get("ranks") or []:
            if not isinstance(r, dict) or r.get("rank") is None:
                continue
            rank = int(r["rank"])
            hook = float(r.get("python_hook_ns") or 0.0)
            n = int(counts.get(rank, 0))
            if n > 0 and hook > 0:
                out[rank] = hook / n / 1e6
    return pd.Series(out, dtype=np.float64)


def _clip_to(calls_: pd.DataFrame, rank: np.ndarray, b: np.ndarray, f: np.ndarray,
             use: np.ndarray, lo: np.ndarray, hi: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each call's step window (-1: none, or a window not in `use`) and its
    interval clipped to that window's [lo, hi]."""
    cr = calls_["rank"].to_numpy(dtype=np.int64)
    c0 = calls_["t_start_ns"].to_numpy(dtype=np.int64)
    c1 = calls_["t_end_ns"].to_numpy(dtype=np.int64)
    w = _locate(rank, b, f, cr, c0)
    ok = w >= 0
    ok[ok] &= use[w[ok]]
    w = np.where(ok, w, -1)
    ws = np.maximum(w, 0)
    return w, np.maximum(c0, lo[ws]), np.minimum(c1, hi[ws])


def _calls(df: pd.DataFrame, kinds: list[str]) -> pd.DataFrame:
    """Communication calls of the given kinds (host rows; no device twins)."""
    mask = ~isin(df["backend"], ["app"]) if "backend" in df.columns else np.ones(len(df), bool)
    mask = mask & ~isin(df["op"], LIFECYCLE_OPS)
    if "kind" in df.columns:
        mask = mask & isin(df["kind"], kinds)
    if "device" in df.columns:
        mask = mask & ~df["device"].to_numpy(dtype=bool)
    return df.loc[mask]


def rank_breakdown(df: pd.DataFrame, meta: Mapping[str, Any] | None = None, *,
                   n_ranks: int | None = None) -> pd.DataFrame:
    """One row per (rank, step): the step's parts (see the module docstring).

    Columns: rank, step, t_start_ns, t_end_ns, wall_ms, compute_ms,
    wait_ranks_ms, horovod_ms, transfer_ms, profiler_ms, unexplained_ms,
    negotiation_ms (part of horovod_ms), completion_ms (part of horovod_ms),
    arrival_ns (the rank's last tensor handed to Horovod; its entry into the
    step's last blocking collective without synchronize), sync_start_ns,
    sync_end_ns, source ("sync": Horovod's synchronize; "calls": blocking
    collectives on the main thread; "none": neither, the step is all compute).
    Every row's parts sum to wall_ms.  n_ranks: the job's ranks (default: the
    ranks with rows in df), for a df that holds only some ranks' rows."""
    if df.empty or "op" not in df.columns:
        return _empty()
    st = _steps(df)
    if st.empty:
        return _empty()
    st = st.sort_values(["rank", "t_start_ns"], kind="stable").reset_index(drop=True)
    n = len(st)
    rank = st["rank"].to_numpy()
    b = st["t_start_ns"].to_numpy()
    f = st["t_end_ns"].to_numpy()
    wall = (f - b).astype(np.float64)

    sync = _app_rows(df, "sync")
    a = np.full(n, -1, dtype=np.int64)
    e = np.full(n, -1, dtype=np.int64)
    if len(sync):
        sr = sync["rank"].to_numpy(dtype=np.int64)
        s0 = sync["t_start_ns"].to_numpy(dtype=np.int64)
        s1 = sync["t_end_ns"].to_numpy(dtype=np.int64)
        w = _locate(rank, b, f, sr, s0)
        ok = w >= 0
        # one synchronize per step; should there be more, the last one counts
        order = np.argsort(s0[ok], kind="stable")
        a[w[ok][order]] = s0[ok][order]
        e[w[ok][order]] = np.minimum(s1[ok][order], f[w[ok][order]])
    has_sync = a >= 0

    # arrival: the end of the rank's last tensor enqueue before synchronize
    arrival = np.where(has_sync, a, -1)
    tens = _app_rows(df, "tensor")
    if len(tens) and has_sync.any():
        tr = tens["rank"].to_numpy(dtype=np.int64)
        t1 = tens["t_end_ns"].to_numpy(dtype=np.int64)
        w = _locate(rank, b, f, tr, tens["t_start_ns"].to_numpy(dtype=np.int64))
        ok = w >= 0
        ok[ok] &= has_sync[w[ok]] & (t1[ok] <= a[w[ok]])
        last = np.full(n, -1, dtype=np.int64)
        np.maximum.at(last, w[ok], t1[ok])
        arrival = np.where(last >= 0, last, arrival)

    parts = {p: np.zeros(n, dtype=np.float64) for p in PARTS}
    negotiation = np.zeros(n, dtype=np.float64)
    completion = np.zeros(n, dtype=np.float64)
    source = np.where(has_sync, "sync", "none").astype(object)

    # the job's arrival per step: the last rank's (only where every rank has
    # it, or is in hvd.join: a rank whose data ran out holds no step back)
    if n_ranks is None:
        n_ranks = int(pd.unique(df["rank"]).size)
    frame = pd.DataFrame({"step": st["step"].to_numpy(), "arrival": arrival})
    g = frame.loc[arrival >= 0].groupby("step")["arrival"]
    job_arr = g.max()
    complete = (g.size() + _in_join(df, job_arr.to_numpy(dtype=np.int64))) >= n_ranks
    A = frame["step"].map(job_arr.where(complete)).to_numpy(dtype=np.float64)
    A = np.where(has_sync, A, np.nan)

    sync_len = np.where(has_sync, e - a, 0).astype(np.float64)
    known = has_sync & np.isfinite(A)
    wait = np.zeros(n, dtype=np.float64)
    wait[known] = np.clip(A[known] - a[known], 0.0, sync_len[known])
    parts["wait_ranks"] = wait
    lo = np.where(known, a + wait, e).astype(np.int64)  # window after the last arrival

    if known.any():
        data_end = np.full(n, -1, dtype=np.int64)
        data = _calls(df, ["data"])
        if not data.empty:
            w, t0, t1c = _clip_to(data, rank, b, f, known, lo, e)
            parts["transfer"], _ = _union(w, t0, t1c, n)
            # the last data call of the step that ended after the last arrival
            # (it may have run before this rank entered synchronize)
            a_job = np.where(known, np.nan_to_num(A, nan=0.0), 0).astype(np.int64)
            w, t0, t1c = _clip_to(data, rank, b, f, known, a_job, e)
            _, data_end = _union(w, t0, t1c, n)
        with_data = known & (data_end >= 0)
        cyc_end = np.clip(data_end, lo, e)  # the end of the cycle part, inside the window
        ctrl = _calls(df, ["control"])
        if not ctrl.empty:  # negotiation: control calls before the last data call's end
            w, t0, t1c = _clip_to(ctrl, rank, b, f, with_data, lo, cyc_end)
            negotiation, _ = _union(w, t0, t1c, n)
        busy = np.where(with_data, cyc_end - lo, 0).astype(np.float64)
        parts["horovod"] = np.where(with_data, np.maximum(busy - parts["transfer"], 0.0), 0.0)
        completion = np.where(with_data, (e - cyc_end).astype(np.float64), 0.0)
        parts["horovod"] += completion
        negotiation = np.minimum(negotiation, parts["horovod"])
        # a window after the last arrival with no data call: unexplained
        parts["unexplained"] = np.where(known & ~with_data, (e - lo).astype(np.float64), 0.0)
    parts["unexplained"] += np.where(has_sync & ~known, sync_len, 0.0)

    # programs without synchronize: blocking collectives on the main thread
    no_sync = ~has_sync
    if no_sync.any():
        _blocking(df, st, no_sync, parts, arrival, source)

    # the profiler's hooks, taken from compute
    prof = st["rank"].map(_profiler_ms(meta, st)).fillna(0.0).to_numpy(dtype=np.float64) * 1e6
    outside = wall - sync_len - np.where(no_sync & (source == "calls"),
                                         parts["wait_ranks"] + parts["transfer"], 0.0)
    parts["profiler"] = np.clip(prof, 0.0, np.maximum(outside, 0.0))
    parts["compute"] = np.maximum(outside - parts["profiler"], 0.0)
    # whatever rounding or overlap left: unexplained, so that the parts sum to the wall
    rest = wall - sum(parts[p] for p in PARTS)
    parts["unexplained"] += rest

    out = st.copy()
    out["wall_ms"] = wall / 1e6
    for p in PARTS:
        out[f"{p}_ms"] = parts[p] / 1e6
    out["negotiation_ms"] = negotiation / 1e6
    out["completion_ms"] = completion / 1e6
    out["arrival_ns"] = arrival
    out["sync_start_ns"] = a
    out["sync_end_ns"] = e
    out["source"] = source
    return out.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)[_COLUMNS]


def _blocking(df: pd.DataFrame, st: pd.DataFrame, rows: np.ndarray,
              parts: dict[str, np.ndarray], arrival: np.ndarray, source: np.ndarray) -> None:
    """Parts from blocking collectives on the main thread, matched across ranks
    (fills wait_ranks and transfer of the steps in `rows`)."""
    need = {"comm", "seq", "thread_kind"}
    if not need <= set(df.columns):
        return
    calls_ = _calls(df, ["data", "control"])
    calls_ = calls_.loc[isin(calls_["thread_kind"], ["main"])]
    if "flags" in calls_.columns:  # nonblocking records are not waits of this thread
        calls_ = calls_.loc[(calls_["flags"].to_numpy(dtype=np.int64) & 0x0004) == 0]
    if calls_.empty:
        return
    n = len(st)
    rank = st["rank"].to_numpy()
    b = st["t_start_ns"].to_numpy()
    f = st["t_end_ns"].to_numpy()
    c = pd.DataFrame({"rank": calls_["rank"].to_numpy(dtype=np.int64),
                      "comm": calls_["comm"].to_numpy(dtype=np.uint64),
                      "seq": calls_["seq"].to_numpy(dtype=np.int64),
                      "t0": calls_["t_start_ns"].to_numpy(dtype=np.int64),
                      "t1": calls_["t_end_ns"].to_numpy(dtype=np.int64)})
    if "comm_size" in calls_.columns:
        c["size"] = calls_["comm_size"].to_numpy(dtype=np.int64)
    else:
        c["size"] = int(pd.unique(df["rank"]).size)
    g = c.groupby(["comm", "seq"])["t0"]
    c["last"] = g.transform("max")
    c["seen"] = g.transform("size")
    matched = (c["seen"] >= c["size"]).to_numpy()
    dur = (c["t1"] - c["t0"]).to_numpy(dtype=np.float64)
    wait = np.where(matched, np.clip((c["last"] - c["t0"]).to_numpy(dtype=np.float64), 0.0, dur),
                    0.0)
    w = _locate(rank, b, f, c["rank"].to_numpy(), c["t0"].to_numpy())
    ok = (w >= 0)
    ok[ok] &= rows[w[ok]]
    if not ok.any():
        return
    parts["wait_ranks"] += np.bincount(w[ok], weights=wait[ok], minlength=n)
    parts["transfer"] += np.bincount(w[ok], weights=(dur - wait)[ok], minlength=n)
    # the rank's arrival at its last matched call of the step
    last = np.full(n, -1, dtype=np.int64)
    okm = ok & matched
    np.maximum.at(last, w[okm], c["t0"].to_numpy()[okm])
    hit = rows & (last >= 0)
    arrival[hit] = last[hit]
    source[rows & (np.bincount(w[ok], minlength=n) > 0)] = "calls"


def last_ranks(bd: pd.DataFrame) -> pd.DataFrame:
    """Per step with every rank's arrival: the last rank, how far it trailed the
    next-to-last (``lead_ms``), and the ranks.  Columns: step, last_rank,
    lead_ms, ranks, tie (several ranks share the latest arrival)."""
    cols = ["step", "last_rank", "lead_ms", "ranks", "tie"]
    if bd.empty:
        return pd.DataFrame({c: [] for c in cols})
    r = bd.loc[bd["arrival_ns"] >= 0, ["step", "rank", "arrival_ns"]]
    n_ranks = int(bd["rank"].nunique())
    r = r.loc[r.groupby("step")["rank"].transform("size") >= max(n_ranks, 2)]
    if r.empty:
        return pd.DataFrame({c: [] for c in cols})
    r = r.sort_values(["step", "arrival_ns", "rank"], kind="stable")
    g = r.groupby("step", sort=True)
    top = g.tail(1).set_index("step")
    second = g.nth(-2).set_index("step")["arrival_ns"]
    out = pd.DataFrame({"step": top.index.to_numpy(),
                        "last_rank": top["rank"].to_numpy(dtype=np.int64)})
    lead = (top["arrival_ns"] - second.reindex(top.index)).to_numpy(dtype=np.float64)
    out["lead_ms"] = lead / 1e6
    out["ranks"] = g.size().to_numpy()
    out["tie"] = lead <= 0
    return out[cols]


def caused_wait(bd: pd.DataFrame, rank: int) -> np.ndarray:
    """Per step (of last_ranks), the waiting `rank` alone caused, in the
    breakdown's units (ms per rank, averaged over the ranks): in a step where it
    arrived last, each other rank's wait up to the time by which it trailed the
    next-to-last; 0 in the other steps."""
    lr = last_ranks(bd)
    if lr.empty:
        return np.zeros(0)
    mine = lr.loc[(lr["last_rank"] == rank) & ~lr["tie"], ["step", "lead_ms"]]
    per_step = pd.Series(0.0, index=lr["step"].to_numpy())
    if len(mine):
        w = bd.loc[bd["step"].isin(mine["step"]) & (bd["rank"] != rank),
                   ["step", "wait_ranks_ms"]].merge(mine, on="step")
        w["caused"] = np.minimum(w["wait_ranks_ms"], w["lead_ms"])
        n = bd.loc[bd["step"].isin(lr["step"])].groupby("step")["rank"].size()
        s = w.groupby("step")["caused"].sum() / n.reindex(w["step"].unique()).to_numpy()
        per_step.loc[s.index] = s.to_numpy()
    return per_step.to_numpy(dtype=np.float64)


def _arrivals_ms(bd: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(last_ranks(bd), each of its steps' arrivals: rows step, columns rank,
    ms after the step's first arrival)."""
    lr = last_ranks(bd)
    if lr.empty:
        return lr, pd.DataFrame()
    r = bd.loc[(bd["arrival_ns"] >= 0) & bd["step"].isin(lr["step"]),
               ["step", "rank", "arrival_ns"]]
    # relative to each step's first arrival: ns since the epoch lose precision in float64
    rel = r["arrival_ns"] - r.groupby("step")["arrival_ns"].transform("min")
    table = (r.assign(t=rel.astype(np.float64) / 1e6)
             .pivot_table(index="step", columns="rank", values="t", aggfunc="max")
             .reindex(lr["step"].to_numpy()))
    return lr, table


def _gain(table: pd.DataFrame, moved: pd.DataFrame) -> np.ndarray:
    """Per step: how much earlier the last arrival comes once the arrivals
    are `moved` (the tail after it, the final transfers, unchanged)."""
    return (table.max(axis=1) - moved.max(axis=1)).clip(lower=0.0).fillna(0.0).to_numpy(
        dtype=np.float64)


def counterfactual_gain(bd: pd.DataFrame, rank: int) -> tuple[np.ndarray, float]:
    """How much sooner each step (of last_ranks) would end if `rank` were not
    systematically late: (ms per step, the rank's systematic excess in ms).

    The excess is the median over steps of the rank's arrival minus the median
    of the others' in the same step (at least 0): what it adds beyond the
    jitter every rank shares.  Its arrivals move earlier by that much, each
    step's last arrival is recomputed, and the gain is how much earlier it
    comes; the tail after the last arrival (the final transfers) is assumed
    unchanged.  A step where the rank was last only by its share of the
    common jitter stays as it was, so the gain is never the rank's whole lead
    (which also removes its part of the jitter), nor the others' waiting
    averaged over the ranks (which leaves out the rank's own late work)."""
    lr, table = _arrivals_ms(bd)
    if lr.empty:
        return np.zeros(0), 0.0
    if rank not in table.columns or table.shape[1] < 2:
        return np.zeros(len(lr)), 0.0
    diff = (table[rank] - table.drop(columns=[rank]).median(axis=1)).to_numpy(dtype=np.float64)
    diff = diff[np.isfinite(diff)]
    excess = max(float(np.median(diff)), 0.0) if diff.size else 0.0
    moved = table.copy()
    moved[rank] = table[rank] - excess
    return _gain(table, moved), excess


def shifted_gain(bd: pd.DataFrame, earlier_ms: pd.DataFrame) -> pd.Series:
    """How much sooner each step (of last_ranks, index) would end if each rank
    arrived `earlier_ms` sooner in it (rows step, columns rank; missing: 0):
    time a cause added before the ranks' arrivals, taken out where it was
    spent.  Each step's last arrival is recomputed, so only the ranks that
    end up last count: a cause on one rank of many gains the step at most
    that rank's lead, one on every rank about its wait on the last."""
    lr, table = _arrivals_ms(bd)
    if lr.empty or table.shape[1] < 2:
        return pd.Series(0.0, index=lr["step"].to_numpy(), dtype=np.float64)
    shift = earlier_ms.reindex(index=table.index, columns=table.columns).fillna(0.0)
    moved = table - shift.clip(lower=0.0)
    return pd.Series(_gain(table, moved), index=table.index, dtype=np.float64)


def breakdown_summary(bd: pd.DataFrame, steps: pd.Series | None = None) -> pd.DataFrame:
    """The job's breakdown: per part, the mean over steps of the ranks' mean,
    its 95% bootstrap interval over steps, and its share of the step.
    `steps`: the steps to use (default all).  Columns: part, label, ms, lo_ms,
    hi_ms, share; empty when no step has a synchronize or blocking collective
    to split it by."""
    from .stats import bootstrap_mean

    cols = ["part", "label", "ms", "lo_ms", "hi_ms", "share"]
    if bd.empty or (bd["source"] == "none").all():  # no synchronize, no blocking call:
        return pd.DataFrame({c: [] for c in cols})   # every step would read as compute
    sub = bd if steps is None else bd.loc[bd["step"].isin(steps)]
    if sub.empty:
        return pd.DataFrame({c: [] for c in cols})
    per = sub.groupby("step")[["wall_ms", *[f"{p}_ms" for p in PARTS]]].mean()
    wall = float(per["wall_ms"].mean())
    rows = []
    for p in PARTS:
        m, lo, hi = bootstrap_mean(per[f"{p}_ms"].to_numpy())
        rows.append({"part": p, "label": LABELS[p], "ms": m, "lo_ms": lo, "hi_ms": hi,
                     "share": m / wall if wall > 0 else float("nan")})
    return pd.DataFrame(rows, columns=cols)
