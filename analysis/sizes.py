"""Message-size distribution, with and without tensor fusion (the central
figure of Awan et al., "Communication Profiling and Characterization of Deep
Learning Workloads on Clusters with High-Performance Interconnects"): how many
calls, and how many bytes, reach each size.

Counting convention: a collective call appears once per participating rank in
the trace.  By default the distribution is taken from one rank per trace (the
lowest rank present, normally rank 0), i.e. it counts *calls as one rank makes
them*, which is what the paper plots and what `profiler bench --sizes-from`
replays.  ``rank=None`` pools every rank's rows instead (counts x ranks).

Buckets: ``bucket="pow2"`` puts a size n in the power-of-two bucket 2^k with
2^(k-1) < n <= 2^k (0 bytes is the bucket 0); ``bucket="exact"`` keeps every
distinct size.  Traces are told apart by the ``label`` column (``load(a, b,
label=["fused", "unfused"])``); fused vs unfused is whatever the labels say.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd

from profiler.errors import UsageError
from profiler.units import fmt_bytes

from ._frame import (
    calls,
    distinct,
    is_pow2,
    isin,
    keys_of,
    label_keys,
    lowest_rank_view,
    pow2_bucket,
)

Bucket = Literal["pow2", "exact"]
RankSel = int | Literal["lowest"] | None

__all__ = ["select_rank", "size_distribution", "size_summary", "fusion_table"]


def select_rank(df: pd.DataFrame, rank: RankSel) -> pd.DataFrame:
    """Rows of one rank: "lowest" (per label), an int, or None (every rank)."""
    if rank is None:
        return df
    if rank == "lowest":
        return lowest_rank_view(df)
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool):
        raise UsageError(None, f"rank must be an int, 'lowest' or None, got {rank!r}")
    out = df.loc[df["rank"] == int(rank)]
    if out.empty and not df.empty:
        raise UsageError(None, f"rank {rank} has no calls in this trace")
    return out


def _size_key(nbytes: pd.Series, bucket: Bucket) -> np.ndarray:
    if bucket == "pow2":
        return pow2_bucket(nbytes.to_numpy())
    if bucket == "exact":
        return nbytes.to_numpy(dtype=np.int64)
    raise UsageError(None, f"bucket must be 'pow2' or 'exact', got {bucket!r}")


def size_distribution(
    df: pd.DataFrame,
    *,
    bucket: Bucket = "pow2",
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    rank: RankSel = "lowest",
    by_op: bool = False,
) -> pd.DataFrame:
    """Calls and bytes per size bucket (or exact size), per label [and op].

    Columns: [label], [op], size (bucket upper bound, or the exact size), size_lo
    (exclusive lower bound of the bucket; equal to size for exact), size_label,
    is_pow2, calls, bytes, calls_share, bytes_share (shares within the label).
    Sorted by label, op, size.
    """
    sel = select_rank(calls(df, kinds=kinds, ops=ops), rank)
    keys = label_keys(sel) + (["op"] if by_op else [])
    work = pd.DataFrame({"size": _size_key(sel["bytes"], bucket),
                         "bytes": sel["bytes"].to_numpy(dtype=np.int64)})
    for k in keys:
        work[k] = keys_of(sel[k])
    cols = [*keys, "size", "size_lo", "size_label", "is_pow2", "calls", "bytes",
            "calls_share", "bytes_share"]
    if work.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    out = (work.groupby([*keys, "size"], sort=True, observed=True)
           .agg(calls=("bytes", "size"), bytes=("bytes", "sum")).reset_index())
    for k in keys:
        out[k] = out[k].astype(str)
    out["calls"] = out["calls"].astype(np.int64)
    out["bytes"] = out["bytes"].astype(np.int64)
    size = out["size"].to_numpy(dtype=np.int64)
    if bucket == "pow2":
        out["size_lo"] = np.where(size > 1, size // 2, 0)
        out["size_label"] = [f"\u2264 {fmt_bytes(s)}" if s > 0 else "0 B" for s in size]
    else:
        out["size_lo"] = size
        out["size_label"] = [fmt_bytes(s) if s % 1024 == 0 or s < 1024 else f"{s} B"
                             for s in size]
    out["is_pow2"] = is_pow2(size)
    tot_keys = label_keys(out)
    if tot_keys:
        calls_tot = out.groupby(tot_keys)["calls"].transform("sum")
        bytes_tot = out.groupby(tot_keys)["bytes"].transform("sum")
    else:
        calls_tot = pd.Series(out["calls"].sum(), index=out.index)
        bytes_tot = pd.Series(out["bytes"].sum(), index=out.index)
    out["calls_share"] = out["calls"] / calls_tot
    out["bytes_share"] = np.where(bytes_tot > 0, out["bytes"] / bytes_tot.where(bytes_tot > 0, 1),
                                  0.0)
    return out[cols].reset_index(drop=True)


def size_summary(
    df: pd.DataFrame,
    *,
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    rank: RankSel = "lowest",
) -> pd.DataFrame:
    """One row per label: calls, bytes, mean/median/max size, distinct sizes, and the
    share of calls whose size is a power of two."""
    sel = select_rank(calls(df, kinds=kinds, ops=ops), rank)
    keys = label_keys(sel)
    rows = []
    groups = sel.groupby(keys, observed=True, sort=True) if keys else [((), sel)]
    for key, sub in groups:
        b = sub["bytes"].to_numpy(dtype=np.int64)
        row: dict[str, object] = {}
        if keys:
            row["label"] = key[0] if isinstance(key, tuple) else key
        row.update(
            calls=int(b.size),
            bytes=int(b.sum()),
            mean_bytes=float(b.mean()) if b.size else float("nan"),
            median_bytes=float(np.median(b)) if b.size else float("nan"),
            max_bytes=int(b.max()) if b.size else 0,
            distinct_sizes=int(np.unique(b).size),
            pow2_share=float(is_pow2(b).mean()) if b.size else float("nan"),
        )
        rows.append(row)
    cols = [*keys, "calls", "bytes", "mean_bytes", "median_bytes", "max_bytes",
            "distinct_sizes", "pow2_share"]
    return pd.DataFrame(rows, columns=cols)


def fusion_table(
    df: pd.DataFrame,
    *,
    labels: Sequence[str] | None = None,
    bucket: Bucket = "pow2",
    kinds: str | Sequence[str] | None = ("data",),
    ops: str | Sequence[str] | None = None,
    rank: RankSel = "lowest",
) -> pd.DataFrame:
    """Side by side per size: one ``calls[<label>]`` and ``bytes[<label>]`` column per
    label (e.g. fused and unfused), zero where a label has no call of that size.

    labels: which labels, in which order (default: all, in order of appearance)."""
    if "label" not in df.columns:
        raise UsageError(None, "fusion_table needs several traces: load them with labels, "
                               "e.g. load(fused, unfused, label=['fused', 'unfused'])")
    present = distinct(df["label"])
    chosen = list(labels) if labels is not None else present
    unknown = [lb for lb in chosen if lb not in present]
    if unknown:
        raise UsageError(None, f"unknown label(s) {', '.join(unknown)}; the frame has "
                               f"{', '.join(present)}")
    dist = size_distribution(df.loc[isin(df["label"], chosen)], bucket=bucket,
                             kinds=kinds, ops=ops, rank=rank)
    base = dist[["size", "size_label", "is_pow2"]].drop_duplicates("size").sort_values("size")
    out = base.reset_index(drop=True)
    for lb in chosen:
        part = dist.loc[dist["label"] == lb].set_index("size")
        out[f"calls[{lb}]"] = out["size"].map(part["calls"]).fillna(0).astype(np.int64)
        out[f"bytes[{lb}]"] = out["size"].map(part["bytes"]).fillna(0).astype(np.int64)
    return out
