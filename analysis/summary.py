"""Per-collective, per-size summary of communication calls (`profiler summarize`).

`summarize(df, by=["op", "bucket"])` groups the communication calls (host
rows; application rows and MPI_Init/Finalize left out) and reports calls,
bytes, latency statistics and bandwidth per group:

* latency: total / mean / p50 / p95 / p99 / max, in microseconds (percentiles
  with linear interpolation, as numpy);
* algbw_gbps: total bytes / total time (per call algbw = bytes / duration,
  aggregated as a ratio of sums), GB/s = bytes per nanosecond;
* busbw_gbps: algbw x the nccl-tests factor of the op at the call's
  communicator size n: allreduce 2(n-1)/n; reduce_scatter, allgather, alltoall
  (and their v/block variants, gather) (n-1)/n; bcast, reduce 1;
* time_share: the group's share of the summarized communication time;
* pow2: False when the group holds a size that is not a power of two (0 B
  counts as regular).

Grouping keys (`by`): op, bytes (exact size), bucket (power-of-two bucket,
"2 KiB-4 KiB" holds sizes in (2048, 4096], as analysis.sizes), rank, thread
(main / horovod / other / stream), comm ("<name> (<id>)"), kind (data /
control), and also track, dtype, backend, step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from profiler.errors import UsageError
from profiler.formats.filters import RowFilter

from ._frame import NON_CALL_OPS, is_pow2, pow2_bucket
from .metrics import (
    METRICS,
    QUANTILES,
    bucket_label,
    bus_factor,
    bus_factors,
    empty_summary,
    finish,
)

__all__ = ["BY_KEYS", "METRICS", "empty_summary", "summarize", "summarize_aggregates",
           "bucket_label",
           "bus_factor", "comm_time_imbalance", "comm_calls"]

BY_KEYS: dict[str, str] = {
    "op": "op",
    "bytes": "bytes",
    "bucket": "bytes",
    "rank": "rank",
    "thread": "thread_kind",
    "comm": "comm",
    "kind": "kind",
    "track": "track",
    "dtype": "dtype",
    "backend": "backend",
    "step": "step",
}


def comm_calls(df: pd.DataFrame, kinds: str | Sequence[str] | None = None,
               rank: int | Sequence[int] | None = None) -> pd.DataFrame:
    """Communication calls (as analysis._frame.calls: host rows, no app rows, no
    init/finalize), optionally of some kinds and ranks.  Compares categorical
    columns through their categories, never converting a million strings."""
    mask = np.ones(len(df), dtype=bool)
    if "backend" in df.columns:
        mask &= (df["backend"] != "app").to_numpy(dtype=bool)
    mask &= ~df["op"].isin(NON_CALL_OPS).to_numpy(dtype=bool)
    if "device" in df.columns:
        mask &= ~df["device"].to_numpy(dtype=bool)
    if kinds is not None or rank is not None:
        mask &= RowFilter.of(
            kinds=None if kinds is None else [kinds] if isinstance(kinds, str) else kinds,
            ranks=None if rank is None else [rank] if isinstance(rank, (int, np.integer))
            else rank).mask(df)
    out = df.loc[mask]
    if "device" in df.columns and bool(df["device"].any()):
        out = _device_times(out, df.loc[df["device"].to_numpy(dtype=bool)])
    return out


_MATCH = ["rank", "comm", "seq", "op"]


def _device_times(host: pd.DataFrame, dev: pd.DataFrame) -> pd.DataFrame:
    """NCCL calls return after enqueueing: a host row's duration is the enqueue
    time.  Where the hooks recorded the call's device interval (a `device` row
    with the same rank, communicator, sequence number and op), the call is
    timed by it; counts and bytes stay those of the host rows."""
    need = [c for c in (*_MATCH, "t_start_ns", "t_end_ns", "dur_ns") if c not in host.columns]
    if need:
        raise UsageError(None, f"the frame has device rows (NCCL) but no {need[0]} column: "
                               "load() it too (device rows time their host calls by "
                               "rank, comm, seq and op)")
    dev = dev.loc[dev["op"] != "nccl_group", _MATCH + ["t_start_ns", "t_end_ns", "dur_ns"]]
    if dev.empty or host.empty:
        return host
    keyed = host[_MATCH].reset_index(drop=True).astype(
        {"op": str}).merge(dev.astype({"op": str}).drop_duplicates(_MATCH), on=_MATCH,
                            how="left")
    found = keyed["dur_ns"].notna().to_numpy()
    if not found.any():
        return host
    host = host.copy()
    for col in ("t_start_ns", "t_end_ns", "dur_ns"):
        vals = host[col].to_numpy().copy()
        vals[found] = keyed.loc[found, col].to_numpy(dtype=vals.dtype)
        host[col] = vals
    return host


def _comm_labels(df: pd.DataFrame) -> pd.Series:
    ids = df["comm"].to_numpy()
    if "comm_name" in df.columns:
        names = df.groupby("comm", observed=True, sort=False)["comm_name"].first()
        name_of = {int(k): str(v) for k, v in names.items()}
    else:
        name_of = {}
    uniq, inv = np.unique(ids, return_inverse=True)
    labels = [f"{name_of[int(u)]} ({int(u):#x})" if name_of.get(int(u)) else f"{int(u):#x}"
              for u in uniq]  # unique: each holds its id
    return pd.Series(pd.Categorical.from_codes(inv.astype(np.int32), categories=labels),
                     index=df.index)


def _key_frame(df: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    keys: dict[str, Any] = {}
    for key in by:
        if key not in BY_KEYS:
            raise UsageError(None, f"unknown --by key {key!r} (choose from "
                                   f"{', '.join(BY_KEYS)})")
        col = BY_KEYS[key]
        if key == "kind" and col not in df.columns:
            keys[key] = pd.Series("data", index=df.index, dtype="category")
            continue
        if col not in df.columns:
            raise UsageError(None, f"--by {key}: the trace has no {col} column")
        if key == "bucket":
            keys[key] = pd.Series(pow2_bucket(df["bytes"].to_numpy()), index=df.index)
        elif key == "comm":
            keys[key] = _comm_labels(df)
        else:
            keys[key] = df[col]
    return pd.DataFrame(keys, index=df.index)


def _quantiles(values: np.ndarray, codes: np.ndarray, ngroups: int,
               qs: Sequence[float]) -> list[np.ndarray]:
    """Per-group quantiles (linear interpolation) of values, groups given by codes."""
    order = np.lexsort((values, codes))
    v = values[order].astype(np.float64)
    counts = np.bincount(codes, minlength=ngroups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    out = []
    for q in qs:
        pos = starts + q * np.maximum(counts - 1, 0)
        lo = np.floor(pos).astype(np.int64)
        hi = np.ceil(pos).astype(np.int64)
        frac = pos - lo
        out.append(v[lo] + (v[hi] - v[lo]) * frac)
    return out


def summarize(df: pd.DataFrame, by: Sequence[str] | str = ("op", "bucket"),
              rank: int | Sequence[int] | None = None, *,
              kinds: str | Sequence[str] | None = None) -> pd.DataFrame:
    """Group communication calls by `by` and compute the metrics (see module doc).

    rank: keep only these ranks.  kinds: keep only these kinds (None = all).
    Returns keys + METRICS + time_share + pow2, one row per group, sorted by keys
    (bucket and bytes numerically), bucket as its label.
    """
    by_l = [by] if isinstance(by, str) else list(by)
    if len(set(by_l)) != len(by_l):
        raise UsageError(None, f"--by lists a key twice: {', '.join(by_l)}")
    sel = comm_calls(df, kinds=kinds, rank=rank)
    keys = _key_frame(sel, by_l)
    if sel.empty:
        return empty_summary(by_l)

    nbytes = sel["bytes"].to_numpy(dtype=np.int64)
    dur = sel["dur_ns"].to_numpy(dtype=np.int64)
    n = sel["comm_size"].to_numpy() if "comm_size" in sel.columns else np.ones(len(sel))
    bus = nbytes * bus_factors(sel["op"], n)
    work = keys.copy()
    work["_bytes"] = nbytes
    work["_dur"] = dur
    work["_bus"] = np.where(np.isnan(bus), 0.0, bus)
    work["_busok"] = ~np.isnan(bus)
    work["_regular"] = is_pow2(nbytes) | (nbytes == 0)
    if by_l:
        g = work.groupby(by_l, observed=True, sort=True)
        parts = g.agg(calls=("_dur", "size"), total_bytes=("_bytes", "sum"),
                      total_ns=("_dur", "sum"), max_ns=("_dur", "max"), bus=("_bus", "sum"),
                      busok=("_busok", "any"), pow2=("_regular", "all")).reset_index()
        codes = g.ngroup().to_numpy()
    else:
        parts = pd.DataFrame({"calls": [len(work)], "total_bytes": [int(nbytes.sum())],
                              "total_ns": [int(dur.sum())], "max_ns": [int(dur.max())],
                              "bus": [float(work["_bus"].sum())],
                              "busok": [bool(work["_busok"].any())],
                              "pow2": [bool(work["_regular"].all())]})
        codes = np.zeros(len(work), dtype=np.int64)
    for q, v in zip(QUANTILES, _quantiles(dur, codes, len(parts), QUANTILES)):
        parts[f"q_{q:g}"] = v
    return finish(parts, by_l)


def rank_imbalance(per_rank_ns: pd.Series) -> dict[str, Any] | None:
    """Slowest vs fastest rank from per-rank communication time (ns, indexed by
    rank): {"ranks", "slowest_rank", "slowest_us", "fastest_rank", "fastest_us",
    "ratio", "spread_us"}; None without ranks."""
    if not len(per_rank_ns):
        return None
    slow, fast = int(per_rank_ns.idxmax()), int(per_rank_ns.idxmin())
    s_us, f_us = float(per_rank_ns.max()) / 1e3, float(per_rank_ns.min()) / 1e3
    return {"ranks": int(len(per_rank_ns)), "slowest_rank": slow, "slowest_us": s_us,
            "fastest_rank": fast, "fastest_us": f_us,
            "ratio": s_us / f_us if f_us > 0 else float("inf"), "spread_us": s_us - f_us}


def comm_time_imbalance(df: pd.DataFrame, rank: int | Sequence[int] | None = None, *,
                        kinds: str | Sequence[str] | None = None) -> dict[str, Any] | None:
    """Per-rank total communication time: slowest vs fastest rank (see rank_imbalance),
    or None when there are no calls."""
    sel = comm_calls(df, kinds=kinds, rank=rank)
    if sel.empty:
        return None
    return rank_imbalance(sel.groupby("rank", observed=True)["dur_ns"].sum())


def _hist_midpoints() -> np.ndarray:
    """Midpoint (ticks) of every histogram bucket of the summary-mode aggregates."""
    from profiler.formats.record import AGG_BUCKETS, agg_bucket_bounds

    mids = []
    for b in range(AGG_BUCKETS):
        lo, hi = agg_bucket_bounds(b)
        mids.append(lo if hi - lo <= 1 else (lo + hi) / 2)
    return np.array(mids, dtype=np.float64)


def _hist_quantiles(hist: np.ndarray, scale: np.ndarray, lo: float, hi: float,
                    qs: Sequence[float]) -> list[float]:
    """Quantiles of pooled histograms (rows: entries; scale: ns per tick per entry),
    each estimate clamped to the group's exact [min, max]."""
    values = (_hist_midpoints()[None, :] * scale[:, None]).ravel()
    weights = hist.ravel().astype(np.float64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if not len(values):
        return [float("nan")] * len(qs)
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(weights[order])
    out = []
    for q in qs:
        i = int(np.searchsorted(cum, q * cum[-1], side="left"))
        out.append(float(min(max(values[min(i, len(values) - 1)], lo), hi)))
    return out


def summarize_aggregates(agg: pd.DataFrame, by: Sequence[str] | str = ("op", "bucket"),
                         rank: int | Sequence[int] | None = None, *,
                         kinds: str | Sequence[str] | None = None) -> pd.DataFrame:
    """summarize() for summary-mode aggregates (profiler.analysis.load_aggregates).

    calls, bytes, total, mean and max are exact; p50/p95/p99 come from the
    log-scale histograms (4 buckets per power of two: within about 12 %)."""
    by_l = [by] if isinstance(by, str) else list(by)
    if "step" in by_l:
        raise UsageError(None, "--by step: summary-mode aggregates have no steps")
    sel = comm_calls(agg.assign(device=False) if "device" not in agg.columns else agg,
                     kinds=kinds, rank=rank)
    if sel.empty:
        return summarize(sel.assign(dur_ns=pd.Series(dtype="int64")), by=by_l)
    keys = _key_frame(sel, by_l)
    calls_n = sel["calls"].to_numpy(dtype=np.int64)
    nbytes = sel["bytes"].to_numpy(dtype=np.int64)
    n = sel["comm_size"].to_numpy() if "comm_size" in sel.columns else np.ones(len(sel))
    bus = nbytes * calls_n * bus_factors(sel["op"], n)
    work = keys.copy()
    work["_calls"] = calls_n
    work["_bytes"] = nbytes * calls_n
    work["_total"] = sel["total_ns"].to_numpy(dtype=np.int64)
    work["_max"] = sel["max_ns"].to_numpy(dtype=np.int64)
    work["_min"] = sel["min_ns"].to_numpy(dtype=np.int64)
    work["_bus"] = np.where(np.isnan(bus), 0.0, bus)
    work["_busok"] = ~np.isnan(bus)
    work["_regular"] = is_pow2(nbytes) | (nbytes == 0)
    hist = np.stack([np.asarray(h, dtype=np.int64) for h in sel["hist"]])
    scale = sel["ns_per_tick"].to_numpy(dtype=np.float64)
    if by_l:
        g = work.groupby(by_l, observed=True, sort=True)
        codes = g.ngroup().to_numpy()
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(g.ngroups + 1))
        groups = [(key, order[bounds[i]:bounds[i + 1]])
                  for i, key in enumerate(g.size().index)]
    else:
        groups = [((), np.arange(len(work)))]
    rows = []
    for key, idx in groups:
        w = work.iloc[idx]
        total = float(w["_total"].sum())
        ncalls = int(w["_calls"].sum())
        qs = _hist_quantiles(hist[idx], scale[idx], float(w["_min"].min()),
                             float(w["_max"].max()), QUANTILES)
        keyt = key if isinstance(key, tuple) else (key,)
        row: dict[str, Any] = dict(zip(by_l, keyt))
        row.update({
            "calls": ncalls, "total_bytes": int(w["_bytes"].sum()), "total_ns": total,
            "max_ns": float(w["_max"].max()), "bus": float(w["_bus"].sum()),
            "busok": bool(w["_busok"].any()), "pow2": bool(w["_regular"].all()),
            **{f"q_{q:g}": v for q, v in zip(QUANTILES, qs)},
        })
        rows.append(row)
    return finish(pd.DataFrame(rows), by_l)
