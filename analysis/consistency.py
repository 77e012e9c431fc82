"""Cross-rank consistency of a finished job: the same collective, identified on
every rank by (communicator, sequence number), must be the same call
everywhere.  A different operation, datatype, reduction, root or (for
collectives whose every rank passes the same count) size is the classic cause
of a hang or of silent corruption; ranks with different numbers of calls on a
communicator have left one out.  `profiler check` runs these; `profiler hang`
will run them on a job that did not finish."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._frame import calls

__all__ = ["mismatches", "count_mismatches", "SAME_BYTES_OPS", "ROOTED_OPS", "REDUCING_OPS"]

#: Every rank passes the same count: bytes must agree.
SAME_BYTES_OPS = frozenset({"allreduce", "iallreduce", "bcast", "reduce", "allgather",
                            "alltoall", "reduce_scatter_block", "barrier", "nccl_allreduce",
                            "nccl_broadcast", "nccl_bcast", "nccl_reduce", "nccl_allgather",
                            "nccl_reducescatter", "gloo_allreduce", "gloo_broadcast",
                            "gloo_allgather", "gloo_reducescatter", "gloo_bitand",
                            "gloo_bitor"})
ROOTED_OPS = frozenset({"bcast", "reduce", "gather", "gatherv", "scatter", "scatterv",
                        "nccl_broadcast", "nccl_bcast", "nccl_reduce", "gloo_broadcast",
                        "gloo_ctl_bcast"})
REDUCING_OPS = frozenset({"allreduce", "iallreduce", "reduce", "reduce_scatter",
                          "reduce_scatter_block", "nccl_allreduce", "nccl_reduce",
                          "nccl_reducescatter", "gloo_allreduce", "gloo_reducescatter"})
_FIELDS = ("op", "dtype", "redop", "root", "bytes")
MISMATCH_COLUMNS = ["comm", "seq", "field", "values", "ranks"]


def _matchable(df: pd.DataFrame) -> pd.DataFrame:
    sel = calls(df, kinds=None)
    if "seq" not in sel.columns or "comm" not in sel.columns:
        return sel.iloc[0:0]
    return sel.loc[(sel["seq"].to_numpy() >= 0)]


def mismatches(df: pd.DataFrame, *, limit: int = 1000) -> pd.DataFrame:
    """One row per (comm, seq, field) on which the ranks disagree: field is op,
    dtype, redop, root or bytes; values maps each distinct value to the ranks
    that passed it ("allreduce: 0; bcast: 1").  At most `limit` rows."""
    sel = _matchable(df)
    have = [f for f in _FIELDS if f in sel.columns]
    if sel.empty or not have:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in MISMATCH_COLUMNS})
    work = pd.DataFrame({"comm": sel["comm"].to_numpy().astype(np.uint64),
                         "seq": sel["seq"].to_numpy(dtype=np.int64),
                         "rank": sel["rank"].to_numpy(dtype=np.int64)})
    for f in have:
        work[f] = sel[f].astype(str).to_numpy() if f not in ("root", "bytes") else \
            sel[f].to_numpy(dtype=np.int64)
    g = work.groupby(["comm", "seq"], sort=True)
    nun = g[have].nunique()
    bad = nun.loc[(nun > 1).any(axis=1)]
    rows = []
    for (comm, seq), flags in bad.iterrows():
        part = g.get_group((comm, seq))
        ops = set(part["op"]) if "op" in part.columns else set()
        for f in have:
            if flags[f] <= 1:
                continue
            if f == "bytes" and not ops <= SAME_BYTES_OPS:
                continue  # v-variants: each rank its own counts
            if f == "root" and not ops & ROOTED_OPS:
                continue
            if f == "redop" and not ops & REDUCING_OPS:
                continue
            by_val = part.groupby(f)["rank"].apply(lambda r: sorted(int(x) for x in r))
            text = "; ".join(f"{v}: {','.join(map(str, rs))}" for v, rs in by_val.items())
            rows.append({"comm": int(comm), "seq": int(seq), "field": f, "values": text,
                         "ranks": sorted(int(x) for x in part["rank"])})
            if len(rows) >= limit:
                return pd.DataFrame(rows, columns=MISMATCH_COLUMNS)
    return pd.DataFrame(rows, columns=MISMATCH_COLUMNS)


def count_mismatches(df: pd.DataFrame) -> pd.DataFrame:
    """Communicators on which the ranks made different numbers of calls: per
    communicator and rank, calls and the last sequence number.  Columns: comm,
    rank, calls, last_seq, expected (the most calls any rank made)."""
    sel = _matchable(df)
    cols = ["comm", "rank", "calls", "last_seq", "expected"]
    if sel.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    w = pd.DataFrame({"comm": sel["comm"].to_numpy().astype(np.uint64),
                      "rank": sel["rank"].to_numpy(dtype=np.int64),
                      "seq": sel["seq"].to_numpy(dtype=np.int64)})
    per = w.groupby(["comm", "rank"]).agg(calls=("seq", "size"), last_seq=("seq", "max"))
    per = per.reset_index()
    per["expected"] = per.groupby("comm")["calls"].transform("max")
    odd = per.groupby("comm")["calls"].transform("nunique") > 1
    out = per.loc[odd.to_numpy()]
    return out.loc[out["calls"] < out["expected"], cols].reset_index(drop=True)
