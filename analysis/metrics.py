"""Metric definitions, once: the nccl-tests bus-bandwidth factors (as Python, as
numpy and as SQL, from one table) and the final step of every summary (the
pandas, aggregate, DuckDB and Dask paths all end in `finish`).

A summary row holds, per group: calls, total_bytes, total / mean / p50 / p95 /
p99 / max latency in microseconds, algbw_gbps (total bytes / total time: GB/s
= bytes per ns), busbw_gbps (algbw x the op's bus factor at the communicator
size), time_share (the group's share of the summarized time) and pow2 (False
when a size in the group is not a power of two; 0 B counts as regular).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = ["BUS_FACTORS", "METRICS", "QUANTILES", "PARTIAL_COLUMNS", "bus_factor",
           "bus_factors", "bus_factor_sql", "empty_summary", "finish", "bucket_label"]

# op -> bus factor at communicator size n (nccl-tests' PERFORMANCE.md):
#   "2(n-1)/n": allreduce;  "(n-1)/n": reduce-scatter, allgather, alltoall and
#   their v/block variants, gather;  "1": bcast, reduce, point-to-point.
BUS_FACTORS: dict[str, str] = {
    **dict.fromkeys(("allreduce", "iallreduce", "nccl_allreduce", "gloo_allreduce"),
                    "2(n-1)/n"),
    **dict.fromkeys(("reduce_scatter", "reduce_scatter_block", "nccl_reducescatter",
                     "allgather", "allgatherv", "nccl_allgather", "alltoall", "alltoallv",
                     "gather", "gatherv", "gloo_allgather", "gloo_alltoall",
                     "gloo_reducescatter"), "(n-1)/n"),
    **dict.fromkeys(("bcast", "reduce", "nccl_broadcast", "nccl_bcast", "nccl_reduce",
                     "nccl_send", "nccl_recv", "gloo_broadcast"), "1"),
}

METRICS = ["calls", "total_bytes", "total_us", "mean_us", "p50_us", "p95_us", "p99_us",
           "max_us", "algbw_gbps", "busbw_gbps"]
QUANTILES = (0.5, 0.95, 0.99)
#: What each engine computes per group before `finish`: bus = sum of bytes x bus
#: factor over the calls that have one, busok = some call has one, pow2 = every
#: size regular, q_<q> = the latency quantiles in ns.
PARTIAL_COLUMNS = ["calls", "total_bytes", "total_ns", "max_ns", "bus", "busok", "pow2",
                   *(f"q_{q:g}" for q in QUANTILES)]


def bus_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor for `op` on `n` ranks (NaN: no data moved)."""
    kind = BUS_FACTORS.get(str(op))
    if n <= 0 or kind is None:
        return float("nan")
    if kind == "2(n-1)/n":
        return 2.0 * (n - 1) / n
    if kind == "(n-1)/n":
        return (n - 1) / n
    return 1.0


def bus_factors(op: pd.Series, n: np.ndarray) -> np.ndarray:
    """bus_factor for every row (ops as a Series, communicator sizes as an array)."""
    opc = op if isinstance(op.dtype, pd.CategoricalDtype) else op.astype("category")
    codes = opc.cat.codes.to_numpy()
    names = [str(c) for c in opc.cat.categories]
    out = np.full(len(op), np.nan)
    sizes = np.asarray(n, dtype=np.int64)
    for i, name in enumerate(names):
        sel = codes == i
        if not sel.any():
            continue
        for size in np.unique(sizes[sel]):
            out[sel & (sizes == size)] = bus_factor(name, int(size))
    return out


def bus_factor_sql(n: str, op: str = "op") -> str:
    """bus_factor as a SQL expression over columns `op` and `n` (NULL: no data moved)."""
    def ops(kind: str) -> str:
        return ", ".join("'" + o + "'" for o, k in BUS_FACTORS.items() if k == kind)

    return (f"CASE WHEN {n} <= 0 THEN NULL "
            f"WHEN {op} IN ({ops('2(n-1)/n')}) THEN 2.0 * ({n} - 1) / {n} "
            f"WHEN {op} IN ({ops('(n-1)/n')}) THEN ({n} - 1.0) / {n} "
            f"WHEN {op} IN ({ops('1')}) THEN 1.0 ELSE NULL END")


def bucket_label(upper: int) -> str:
    """Label of the power-of-two bucket whose upper bound is `upper`."""
    from profiler.units import fmt_bytes

    upper = int(upper)
    if upper <= 0:
        return "0 B"
    if upper == 1:
        return "1 B"
    return f"{fmt_bytes(upper // 2)}-{fmt_bytes(upper)}"


def empty_summary(by: Sequence[str]) -> pd.DataFrame:
    """The summary table with no rows: the grouping keys, then METRICS,
    time_share and pow2, with their dtypes."""
    by_l = list(by)
    empty = pd.DataFrame({c: pd.Series(dtype="object") for c in by_l})
    for m in METRICS + ["time_share"]:
        empty[m] = pd.Series(dtype="int64" if m in ("calls", "total_bytes") else "float64")
    empty["pow2"] = pd.Series(dtype="bool")
    return empty[by_l + METRICS + ["time_share", "pow2"]]


def finish(parts: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Per-group partials (PARTIAL_COLUMNS, one row per group, in the order to
    show) -> the summary table: keys + METRICS + time_share + pow2."""
    by_l = list(by)
    if parts.empty:
        return empty_summary(by_l)
    total_ns = parts["total_ns"].to_numpy(dtype=np.float64)
    calls = parts["calls"].to_numpy(dtype=np.int64)
    tb = parts["total_bytes"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(total_ns > 0, tb / total_ns, np.nan)
        busbw = np.where((total_ns > 0) & parts["busok"].to_numpy(dtype=bool),
                         parts["bus"].to_numpy(dtype=np.float64) / total_ns, np.nan)
        mean = np.where(calls > 0, total_ns / np.maximum(calls, 1), np.nan)
    all_ns = float(total_ns.sum())
    res = parts[by_l].copy().reset_index(drop=True)
    res["calls"] = calls
    res["total_bytes"] = parts["total_bytes"].to_numpy().astype(np.int64)
    res["total_us"] = total_ns / 1e3
    res["mean_us"] = mean / 1e3
    for q, name in zip(QUANTILES, ("p50_us", "p95_us", "p99_us")):
        res[name] = parts[f"q_{q:g}"].to_numpy(dtype=np.float64) / 1e3
    res["max_us"] = parts["max_ns"].to_numpy(dtype=np.float64) / 1e3
    res["algbw_gbps"] = algbw
    res["busbw_gbps"] = busbw
    res["time_share"] = total_ns / all_ns if all_ns > 0 else np.nan
    res["pow2"] = parts["pow2"].to_numpy().astype(bool)
    if "bucket" in by_l:
        res["bucket"] = [bucket_label(int(b)) for b in res["bucket"]]
    for k in by_l:
        if isinstance(res[k].dtype, pd.CategoricalDtype):
            res[k] = res[k].astype(str)
    return res[by_l + METRICS + ["time_share", "pow2"]]
