"""Questions about fusion lineage (profiler.formats.lineage): which tensors rode
in each data call, and which rank made the others wait."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def calls(lineage: pd.DataFrame) -> pd.DataFrame:
    """One row per data call that carried tensors (matched rows only).

    Columns: call_comm, call_seq, step, call_op, comm_activity, call_t_start_ns,
    call_dur_ns, call_bytes, n_tensors, tensor_bytes, fill_ratio, tensors
    (list of names), negotiation_ns_max, wait_for_data_ns_max.
    """
    m = lineage[lineage["matched"]]
    cols = ["call_comm", "call_seq", "step", "call_op", "comm_activity", "call_t_start_ns",
            "call_dur_ns", "call_bytes", "n_tensors", "tensor_bytes", "fill_ratio", "tensors",
            "negotiation_ns_max", "wait_for_data_ns_max"]
    if m.empty:
        return pd.DataFrame({c: [] for c in cols})
    g = m.groupby(["call_comm", "call_seq"], sort=False)
    out = g.agg(
        step=("step", "first"), call_op=("call_op", "first"),
        comm_activity=("comm_activity", "first"), call_t_start_ns=("call_t_start_ns", "first"),
        call_dur_ns=("call_dur_ns", "first"), call_bytes=("call_bytes", "first"),
        n_tensors=("tensor", "size"),
        tensor_bytes=("tensor_bytes", "sum"),
        known_bytes=("tensor_bytes", "count"),
        fill_ratio=("fill_ratio", "first"), tensors=("tensor", list),
        negotiation_ns_max=("negotiation_ns", "max"),
        wait_for_data_ns_max=("wait_for_data_ns", "max"),
    ).reset_index()
    out.loc[out["known_bytes"] < out["n_tensors"], "tensor_bytes"] = math.nan
    return out.sort_values("call_t_start_ns", kind="stable").reset_index(drop=True)[cols]


def call_columns(lineage: pd.DataFrame) -> pd.DataFrame:
    """Columns to add to every rank's rows, keyed by (comm, seq): tensors (names
    joined with ";"), n_tensors, fill_ratio.  The same collective has the same
    (comm, seq) on every rank, so rank 0's lineage applies to all ranks."""
    c = calls(lineage)
    return pd.DataFrame({
        "comm": c["call_comm"].astype(np.uint64),
        "seq": c["call_seq"].astype(np.int64),
        "tensors": [";".join(t) for t in c["tensors"]],
        "n_tensors": c["n_tensors"].astype(np.int32),
        "fill_ratio": c["fill_ratio"].astype(np.float64),
    })


def stragglers(lineage: pd.DataFrame, *, min_spread_ns: float = 0.0) -> pd.DataFrame:
    """Per step: the rank that was ready last (made the others wait) and how long.

    From the per-rank readiness marks of uncached negotiations (each tensor's
    first time; every time with HOROVOD_CACHE_CAPACITY=0).  A tensor's wait is
    its readiness spread; the step's straggler is the last-ready rank of the
    tensor with the longest spread.  Columns: step, straggler_rank, wait_ns,
    tensors (with readiness), tensors_waited (spread > min_spread_ns).
    """
    cols = ["step", "straggler_rank", "wait_ns", "tensors", "tensors_waited"]
    r = lineage[(lineage["ready_ranks"] > 1) & lineage["ready_spread_ns"].notna()]
    if r.empty:
        return pd.DataFrame({c: [] for c in cols})
    rows = []
    for step, part in r.groupby("step", sort=True):
        worst = part.loc[part["ready_spread_ns"].idxmax()]
        rows.append({
            "step": int(step),
            "straggler_rank": int(worst["last_ready_rank"]),
            "wait_ns": float(worst["ready_spread_ns"]),
            "tensors": int(len(part)),
            "tensors_waited": int((part["ready_spread_ns"] > min_spread_ns).sum()),
        })
    return pd.DataFrame(rows, columns=cols)


#: per_tensor's columns, in order (`profiler tensors --format json` writes them)
PER_TENSOR_COLUMNS = ["tensor", "op", "calls", "bytes", "total_bytes", "queued_mean_us",
                      "queued_max_us", "negotiation_mean_us", "negotiation_max_us",
                      "wait_mean_us", "fused_with_mean", "calls_matched", "ambiguous",
                      "unmatched", "ways_log10_max", "last_ready_rank"]


def per_tensor(lineage: pd.DataFrame) -> pd.DataFrame:
    """Lineage rows -> one row per (tensor, op): calls, bytes, queueing,
    negotiation and wait-for-data (microseconds), fusion, ambiguity, and the
    rank most often last ready (-1: none known)."""
    if len(lineage) == 0:
        return pd.DataFrame({c: [] for c in PER_TENSOR_COLUMNS})
    df = lineage.copy()
    df["fused_with"] = df["n_tensors"] - 1
    df["ambiguous"] = df["matched"] & (df["confidence"] < 1.0)
    df["unmatched"] = ~df["matched"].astype(bool)
    if "ways_log10" not in df.columns:
        df["ways_log10"] = np.where(df["ambiguous"], np.nan, 0.0)
    g = df.groupby(["tensor", "op"], sort=False)
    out = g.agg(
        calls=("tensor", "size"),
        bytes=("tensor_bytes", "max"),
        total_bytes=("tensor_bytes", "sum"),
        negotiation_mean_us=("negotiation_ns", "mean"),
        negotiation_max_us=("negotiation_ns", "max"),
        wait_mean_us=("wait_for_data_ns", "mean"),
        fused_with_mean=("fused_with", "mean"),
        calls_matched=("matched", "sum"),
        ambiguous=("ambiguous", "sum"),
        unmatched=("unmatched", "sum"),
        ways_log10_max=("ways_log10", "max"),
        queued_mean_us=("queue_ns", "mean"),
        queued_max_us=("queue_ns", "max"),
    ).reset_index()
    out["ambiguous"] = out["ambiguous"].astype(np.int64)
    out["unmatched"] = out["unmatched"].astype(np.int64)
    for c in ("negotiation_mean_us", "negotiation_max_us", "wait_mean_us", "queued_mean_us",
              "queued_max_us"):
        out[c] = out[c] / 1000.0
    ready = df[df["last_ready_rank"] >= 0]
    if len(ready):
        mode = ready.groupby(["tensor", "op"])["last_ready_rank"].agg(
            lambda s: int(s.value_counts().idxmax()))
        out = out.merge(mode.rename("last_ready_rank").reset_index(), on=["tensor", "op"],
                        how="left")
        out["last_ready_rank"] = out["last_ready_rank"].fillna(-1).astype(np.int64)
    else:
        out["last_ready_rank"] = -1
    out["calls_matched"] = out["calls_matched"].astype(np.int64)
    return out[PER_TENSOR_COLUMNS]
