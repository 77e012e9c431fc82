"""The summary query on Dask: the same table as summarize_dataset, computed by a
Dask cluster over the same per-rank parquet files (for datasets one machine
cannot scan in time; any dask.distributed Client, or Dask's local scheduler).

    from dask.distributed import Client
    from profiler.analysis.distributed import summarize_dask
    with Client("scheduler:8786") as client:
        table = summarize_dask("run/trace.json", by=["op", "bucket"], client=client)

Plan: one partition per rank file (``split_row_groups=False``: a rank's host rows
and its NCCL device-time rows meet in one partition, so the device-time
substitution of summary.comm_calls stays local); filters pushed down to the
parquet reader (ranks, steps, ops) and applied row-wise per partition
(comm_calls, kinds); grouping keys computed per partition; then a shuffle on the
keys puts every call of a group in one partition, where the group's exact
percentiles are computed by sorting (the arithmetic of summary.summarize).  The
partial table is tiny and finished on the client by engine.finish_summary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from profiler.errors import UsageError
from profiler.formats.filters import RowFilter

from .engine import Dataset, _as_dataset, _by_list, finish_summary
from .metrics import PARTIAL_COLUMNS, QUANTILES, bus_factors
from .summary import BY_KEYS, _quantiles, comm_calls

__all__ = ["summarize_dask"]



def _keys(sel: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Grouping keys as plain columns (strings or int64): partitions agree on them."""
    from ._frame import pow2_bucket

    out: dict[str, Any] = {}
    for k in by:
        col = BY_KEYS[k]
        if k == "kind" and col not in sel.columns:
            out[k] = np.full(len(sel), "data", dtype=object)
        elif k == "bucket":
            out[k] = pow2_bucket(sel["bytes"].to_numpy()).astype(np.int64)
        elif k in ("comm",):
            out[k] = sel["comm"].to_numpy().astype(np.uint64).view(np.int64)
        elif k in ("bytes", "rank", "track", "step"):
            out[k] = sel[col].to_numpy().astype(np.int64)
        else:
            out[k] = np.asarray(sel[col].astype(str).to_numpy(), dtype=object)
    return pd.DataFrame(out, index=sel.index)


def _prepare(part: pd.DataFrame, by: Sequence[str], flt: RowFilter) -> pd.DataFrame:
    """One rank file -> its communication calls: keys + the per-call values."""
    df = part
    for c in ("backend", "op", "kind", "thread_kind", "dtype", "comm_name"):
        if c in df.columns and not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype("category")
    # ranks and kinds: comm_calls, which keeps the device rows of the calls it keeps
    mask = RowFilter(steps=flt.steps, ops=flt.ops, t_start_ns=flt.t_start_ns).mask(df)
    # device rows stay: comm_calls times NCCL calls by them
    if "device" in df.columns:
        mask |= df["device"].to_numpy(dtype=bool)
    sel = comm_calls(df.loc[mask], kinds=None if flt.kinds is None else list(flt.kinds),
                     rank=None if flt.ranks is None else list(flt.ranks))
    keys = _keys(sel, by)
    nbytes = sel["bytes"].to_numpy(dtype=np.int64)
    n = sel["comm_size"].to_numpy() if "comm_size" in sel.columns else np.ones(len(sel))
    bus = nbytes * bus_factors(sel["op"], n) if len(sel) else np.zeros(0)
    keys["_bytes"] = nbytes
    keys["_dur"] = sel["dur_ns"].to_numpy(dtype=np.int64)
    keys["_bus"] = np.where(np.isnan(bus), 0.0, bus)
    keys["_busok"] = ~np.isnan(bus)
    keys["_regular"] = ((nbytes > 0) & ((nbytes & (nbytes - 1)) == 0)) | (nbytes == 0)
    keys["_one"] = 0
    return keys.reset_index(drop=True)


def _group_stats(g: pd.DataFrame) -> pd.DataFrame:
    """One group's partial row (exact quantiles by sorting its durations)."""
    dur = g["_dur"].to_numpy(dtype=np.int64)
    qs = _quantiles(dur, np.zeros(len(dur), dtype=np.int64), 1, QUANTILES)
    row = {"calls": len(dur), "total_bytes": int(g["_bytes"].sum()),
           "total_ns": int(dur.sum()), "max_ns": int(dur.max()),
           "bus": float(g["_bus"].sum()), "busok": bool(g["_busok"].any()),
           "pow2": bool(g["_regular"].all())}
    for q, v in zip(QUANTILES, qs):
        row[f"q_{q:g}"] = float(v[0])
    return pd.DataFrame([row])


def _meta_frame(by: Sequence[str]) -> pd.DataFrame:
    out: dict[str, pd.Series] = {}
    for k in by:
        out[k] = pd.Series(dtype="int64" if k in ("bucket", "comm", "bytes", "rank", "track",
                                                  "step") else "object")
    for c in PARTIAL_COLUMNS:
        out[c] = pd.Series(dtype={"calls": "int64", "total_bytes": "int64", "total_ns": "int64",
                                  "max_ns": "int64", "busok": "bool", "pow2": "bool"
                                  }.get(c, "float64"))
    return pd.DataFrame(out)


def _columns(ds: Dataset, by: Sequence[str], steps: tuple[int, int] | None) -> list[str]:
    have = set(ds.columns)
    need = {"rank", "backend", "op", "bytes", "dur_ns", "comm_size", "device", "kind", "comm",
            "seq", "t_start_ns", "t_end_ns"}
    for k in by:
        col = BY_KEYS[k]
        if col not in have and k != "kind":
            raise UsageError(None, f"--by {k}: the trace has no {col} column")
        need.add(col)
    if steps is not None:
        if "step" not in have:
            raise UsageError(None, "--steps: the trace has no step column")
        need.add("step")
    return [c for c in ds.columns if c in need]


def summarize_dask(path: str | os.PathLike[str] | Dataset,
                   by: Sequence[str] | str = ("op", "bucket"), *,
                   ranks: Sequence[int] | None = None, steps: tuple[int, int] | None = None,
                   ops: Sequence[str] | None = None, kinds: Sequence[str] | None = None,
                   client: Any = None) -> pd.DataFrame:
    """summarize_dataset computed by Dask (module doc).  client: a
    dask.distributed.Client (None: Dask's default scheduler)."""
    import dask.dataframe as dd

    ds = _as_dataset(path)
    by_l = _by_list(by)
    for k in by_l:
        if k not in BY_KEYS:
            raise UsageError(None, f"unknown --by key {k!r} (choose from {', '.join(BY_KEYS)})")
    flt = ds.filtered(RowFilter.of(ranks=ranks, steps=steps, ops=ops, kinds=kinds)) or \
        RowFilter()
    cols = _columns(ds, by_l, flt.steps)
    filters: list[tuple[str, str, Any]] = []
    if flt.ranks is not None:
        filters.append(("rank", "in", list(flt.ranks)))
    files = ds.files_for(flt) or ds.files[:1]
    ddf = dd.read_parquet([str(f) for f in files], columns=cols,
                          filters=filters or None, split_row_groups=False,
                          calculate_divisions=False)
    prepared = ddf.map_partitions(_prepare, by_l, flt, meta=_prepare(ddf._meta, by_l, flt))
    group_keys = by_l or ["_one"]
    parts = prepared.groupby(group_keys).apply(_group_stats, meta=_meta_frame([]))
    compute = client.compute if client is not None else None
    if compute is not None:
        result = client.compute(parts).result()
    else:
        result = parts.compute()
    result = result.reset_index()
    result = result[[*by_l, *PARTIAL_COLUMNS]] if len(result) else _meta_frame(by_l)
    if "comm" in by_l:
        result["comm"] = result["comm"].to_numpy().astype(np.int64).view(np.uint64)
    names = _comm_names(ds, client) if "comm" in by_l else None
    return finish_summary(result, by_l, comm_names=names)


def _names_part(part: pd.DataFrame) -> pd.DataFrame:
    if part.empty:
        return pd.DataFrame({"comm": pd.Series(dtype="uint64"), "rank": pd.Series(dtype="int64"),
                             "name": pd.Series(dtype="object")})
    g = part.groupby("comm", sort=False).agg(rank=("rank", "min"), name=("comm_name", "first"))
    g = g.reset_index()
    g["name"] = g["name"].astype(str)
    g["rank"] = g["rank"].astype(np.int64)
    return g[["comm", "rank", "name"]]


def _comm_names(ds: Dataset, client: Any) -> dict[int, str]:
    import dask.dataframe as dd

    if "comm_name" not in ds.columns:
        return {}
    ddf = dd.read_parquet([str(f) for f in ds.files], columns=["comm", "comm_name", "rank"],
                          split_row_groups=False, calculate_divisions=False)
    parts = ddf.map_partitions(_names_part, meta=_names_part(ddf._meta.iloc[0:0]))
    got = client.compute(parts).result() if client is not None else parts.compute()
    got = got.sort_values(["comm", "rank"], kind="stable").drop_duplicates("comm")
    return {int(c): str(n) for c, n in zip(got["comm"], got["name"])}
