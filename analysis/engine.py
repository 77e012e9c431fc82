"""The scalable query layer: the per-rank parquet dataset queried in place.

`summarize_dataset(path, by=..., ranks=..., steps=..., ops=..., kinds=...)`
returns the same table as :func:`profiler.analysis.summarize` on the loaded
frame, without loading it: DuckDB scans ranks/*.parquet, pushes the filters
(ranks, steps, ops, kinds) down to the scan, groups, and computes exact
percentiles over every call (linear interpolation between order statistics,
numpy's default, with the arithmetic of summary.summarize) without holding a
group's durations: a histogram pass finds the bucket of each order statistic, a
second pass collects only those buckets (see partials).  Memory stays bounded by
DuckDB's working memory (``memory_limit``, default 2 GB, spilling to a temporary
directory) and LIST_BUDGET, not by the size of the dataset.  Engine choice by
measurement (1024 ranks x 100k calls, 100M rows, this 2-core machine): see
benchmarks/scale_engines.py.

Semantics are those of ``summary.summarize`` / ``summary.comm_calls``:
communication calls are host rows that are neither application rows nor
MPI_Init/MPI_Finalize; NCCL calls with a device-time row (same rank, comm, seq,
op) are timed by it; grouping keys as ``summary.BY_KEYS``; rows sorted like the
in-memory summary (ops, dtypes and kinds in the order of the profiler's enum
tables, numbers numerically, communicators by id).

`Dataset` is the reference to the files (a trace.json, a profile directory,
parquet files); `overview()` gives what `profiler summarize` prints after its
table (per-rank time, control traffic, span, NCCL call count) in one scan.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiler._env import text
from profiler.errors import CorruptError, NotATraceError, NotFoundError, UsageError
from profiler.formats.filters import RowFilter, sql_strings
from profiler.formats.record import LIFECYCLE_OPS, kind_key
from profiler.formats.trace_dataset import Dataset, open_dataset

from .metrics import bus_factor_sql, empty_summary, finish

__all__ = ["Dataset", "RowFilter", "open_dataset", "summarize_dataset", "overview",
           "finish_summary", "stragglers_dataset", "DEFAULT_MEMORY_LIMIT"]

DEFAULT_MEMORY_LIMIT = "2GB"
NON_CALL_OPS = tuple(sorted(LIFECYCLE_OPS))  # profiler.formats.record, defined once


# ---------------------------------------------------------------------------
# DuckDB
# ---------------------------------------------------------------------------
def connect(memory_limit: str | None = None, threads: int | None = None) -> Any:
    """A DuckDB connection with bounded memory (HOROVOD_PROFILE_ANALYSIS_MEMORY, default
    2GB) spilling to the temporary directory."""
    import duckdb

    con = duckdb.connect(":memory:")
    mem = memory_limit or text("HOROVOD_PROFILE_ANALYSIS_MEMORY") or DEFAULT_MEMORY_LIMIT
    con.execute(f"SET memory_limit = '{mem}'")
    con.execute(f"SET temp_directory = '{tempfile.gettempdir()}/hvprof-duckdb'")
    con.execute("SET preserve_insertion_order = false")
    try:  # inside Jupyter, DuckDB refuses this setting without ipywidgets
        con.execute("SET enable_progress_bar = false")
    except Exception:  # duckdb.Error: its default then stays
        pass
    if threads is not None:
        con.execute(f"SET threads = {int(threads)}")
    return con


def _source(ds: Dataset, flt: RowFilter | None = None) -> str:
    chosen = ds.files_for(flt) or ds.files[:1]
    files = ", ".join("'" + str(f).replace("'", "''") + "'" for f in chosen)
    return f"read_parquet([{files}], union_by_name = true)"


#: the column keyed() adds under the bucket key: 2 ** ceil(log2(bytes)) as the
#: floating-point logarithm puts it (off by at most one octave: corrected below)
_POW2_GUESS = "hvp2"


def _pow2_guess_sql(x: str) -> str:
    return (f"CASE WHEN {x} <= 1 THEN 1 ELSE "
            f"(1::BIGINT << CAST(ceil(log2({x})) AS INTEGER)) END AS {_POW2_GUESS}")


def _next_pow2_sql(x: str) -> str:
    """Smallest power of two >= x (0 for x <= 0), exact for every BIGINT below 2**62,
    from the guess column (_pow2_guess_sql): a few integer operations a row (the bits
    of x - 1 smeared right, written as one expression, grew to 64 copies of x)."""
    g = _POW2_GUESS
    return (f"CASE WHEN {x} <= 0 THEN 0 WHEN {g} < {x} THEN {g} << 1 "
            f"WHEN ({g} >> 1) >= {x} THEN {g} >> 1 ELSE {g} END")


def query(con: Any, ds: Dataset, sql: str) -> pd.DataFrame:
    """Run a query over the dataset; DuckDB's errors (unreadable or missing files)
    become ProfilerErrors."""
    try:
        return con.execute(sql).df()
    except Exception as exc:  # duckdb.Error and its IO/invalid-input subclasses
        raise _dataset_error(ds, exc) from None


# What one scan learned about a dataset, kept for the next question in the same
# process (summarize's overview, then advise's whole-job pass): keyed by the
# files, their sizes and modification times, and the question's filters.
_MEMO: dict[tuple[Any, ...], Any] = {}
_MEMO_MAX = 32


def _files_key(ds: Dataset) -> tuple[Any, ...]:
    out = []
    for f in ds.files:
        try:
            st = os.stat(f)
        except OSError:
            return (object(),)  # never found again: not kept
        out.append((str(f), st.st_size, st.st_mtime_ns))
    return (tuple(out), repr(ds.window))


def _memo_get(ds: Dataset, what: str, *key: Any) -> Any:
    return _MEMO.get((_files_key(ds), what, *key))


def _memo_put(ds: Dataset, what: str, value: Any, *key: Any) -> None:
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[(_files_key(ds), what, *key)] = value


def has_device_rows(con: Any, ds: Dataset) -> bool:
    if "device" not in ds.columns:
        return False
    known = _memo_get(ds, "device")
    if known is not None:
        return bool(known)
    got = query(con, ds, f"SELECT count(*) AS n FROM {_source(ds)} WHERE device")
    # a count, never a boolean: DuckDB 2 hands booleans back as numpy.bool_
    found = bool(len(got)) and int(got["n"].iloc[0]) > 0
    _memo_put(ds, "device", found)
    return found


def nccl_extras(ds: Dataset, con: Any = None) -> pd.DataFrame | None:
    """The NCCL host rows that carry the plugin path's network columns
    (net_*) or come from Horovod's timeline (source), with those columns;
    None when the dataset has neither column."""
    have = set(ds.columns)
    cols = [c for c in ("net_send_bytes", "net_recv_bytes", "net_ns", "net_steps", "source")
            if c in have]
    if not cols:
        return None
    con = con or connect()
    conds = []
    if "net_send_bytes" in have:
        conds.append("net_send_bytes >= 0")
    if "source" in have:
        conds.append("source = 'timeline'")
    dev = " AND NOT device" if "device" in have else ""
    sql = (f"SELECT op, {', '.join(cols)} FROM {_source(ds)} "
           f"WHERE ({' OR '.join(conds)}){dev}")
    return query(con, ds, sql)


def calls_sql(ds: Dataset, filters: RowFilter | None, *, device_rows: bool,
              columns: Sequence[str]) -> str:
    """SQL for the communication calls (summary.comm_calls), selecting `columns`
    (dur_ns, t_start_ns, t_end_ns device-substituted when device_rows)."""
    have = set(ds.columns)
    where = ["backend <> 'app'" if "backend" in have else "TRUE",
             f"op NOT IN ({sql_strings(NON_CALL_OPS)})"]
    if "device" in have:
        where.append("NOT device")
    flt = ds.filtered(filters)
    where += flt.sql(have) if flt is not None else []
    exprs = []
    for c in columns:
        if c == "kind" and "kind" not in have:
            exprs.append("'data' AS kind")
        elif c == "comm_size" and "comm_size" not in have:
            exprs.append("1 AS comm_size")
        elif c not in have:
            raise UsageError(ds.path, f"the trace has no {c} column")
        else:
            exprs.append(c)
    host = f"SELECT {', '.join(exprs)} FROM {_source(ds, flt)} WHERE {' AND '.join(where)}"
    if not device_rows:
        return host
    timed = [c for c in ("t_start_ns", "t_end_ns", "dur_ns") if c in columns]
    keys = ["rank", "comm", "seq", "op"]
    extra = [k for k in keys if k not in columns]
    if not timed:
        return host
    host = (f"SELECT {', '.join([*exprs, *extra])} FROM {_source(ds, flt)} "
            f"WHERE {' AND '.join(where)}")
    dev = ("SELECT rank, comm, seq, op, "
           + ", ".join(f"arg_min({c}, t_start_ns) AS d_{c}" for c in timed)
           + f" FROM {_source(ds, flt)} WHERE device AND op <> 'nccl_group' GROUP BY ALL")
    sel = [f"coalesce(d.d_{c}, h.{c}) AS {c}" if c in timed else f"h.{c}" for c in columns]
    return (f"SELECT {', '.join(sel)} FROM ({host}) h LEFT JOIN ({dev}) d "
            "USING (rank, comm, seq, op)")


# ---------------------------------------------------------------------------
# summarize
# ---------------------------------------------------------------------------
def _key_sql(key: str) -> tuple[str, str]:
    """(SQL expression, source column) of a grouping key (summary.BY_KEYS)."""
    from .summary import BY_KEYS

    if key not in BY_KEYS:
        raise UsageError(None, f"unknown --by key {key!r} (choose from {', '.join(BY_KEYS)})")
    col = BY_KEYS[key]
    if key == "bucket":
        return _next_pow2_sql("bytes"), "bytes"
    return col, col


# Exact percentiles in bounded memory.  A holistic quantile aggregate keeps every
# duration of a group in one growing array (at 100M calls DuckDB's quantile_cont
# needs > 2 GB and fails under a 1.8 GB limit); instead:
#   pass 1: one streaming aggregation by (group, log bucket of the duration, 16 per
#           power of two): counts, sums, min, max -- everything but the percentiles
#           is summed from it, and the cumulative counts say which bucket holds each
#           wanted order statistic and how many calls lie below it;
#   pass 2: only the calls of those buckets are collected (a join on (group,
#           bucket)) and sorted: the order statistics are exact, and numpy
#           interpolates between them as summary.summarize does.
# A bucket holding more than LIST_BUDGET calls is split again (4096 linear
# sub-buckets of its [min, max]) before collecting; a bucket whose min == max needs
# no collecting at all.
LOG_BUCKETS_PER_OCTAVE = 16
LIST_BUDGET = 16_000_000
_SUB_BUCKETS = 4096


def _hb_sql(x: str) -> str:
    return (f"CASE WHEN {x} <= 0 THEN -1 ELSE CAST(floor(log2({x}) * "
            f"{LOG_BUCKETS_PER_OCTAVE}) AS INTEGER) END")


def _join_on(n_keys: int, left: str, right: str, extra: Sequence[str] = ()) -> str:
    terms = [f"{left}.k_{i} IS NOT DISTINCT FROM {right}.k_{i}" for i in range(n_keys)]
    terms += [f"{left}.{c} = {right}.{c}" for c in extra]
    return " AND ".join(terms) if terms else "TRUE"


def partials(ds: Dataset, by: Sequence[str], filters: RowFilter | None = None, *,
             con: Any = None, qs: Sequence[float] = (0.5, 0.95, 0.99)) -> pd.DataFrame:
    """One row per group: keys, calls, total_bytes, total_ns, max_ns, bus, busok, pow2,
    q_<q> (exact quantiles of dur_ns): the input of finish_summary.

    The scan computes a few integer operations a row: the keys, the duration's log
    bucket and the power-of-two test.  The bus bandwidth's factor (a function of the
    op and the communicator size) is applied per (group, bucket, op, size) after the
    scan's aggregation, not per row."""
    from .summary import BY_KEYS

    con = con or connect()
    for k in by:
        if k not in BY_KEYS:
            raise UsageError(None, f"unknown --by key {k!r} (choose from "
                                   f"{', '.join(BY_KEYS)})")
        if BY_KEYS[k] not in ds.columns and k != "kind":
            raise UsageError(None, f"--by {k}: the trace has no {BY_KEYS[k]} column")
    need = {"op", "bytes", "dur_ns", "comm_size", "rank"}
    need |= {BY_KEYS[k] for k in by}
    inner = calls_sql(ds, filters, device_rows=has_device_rows(con, ds), columns=sorted(need))
    nk = len(by)
    kcols = [f"k_{i}" for i in range(nk)]
    keyed = _keyed_sql(by, inner)
    ks = "".join(c + ", " for c in kcols)
    per = (f"SELECT {ks}hb, op, comm_size, count(*) AS n, sum(bytes)::HUGEINT AS tb, "
           "sum(dur_ns)::HUGEINT AS tns, max(dur_ns) AS mx, min(dur_ns) AS mn, "
           "bool_and(bytes = 0 OR (bytes > 0 AND (bytes & (bytes - 1)) = 0)) AS pow2 "
           f"FROM ({keyed}) GROUP BY ALL")
    factor = bus_factor_sql("comm_size")
    hist = query(con, ds, (
        f"SELECT {ks}hb, sum(n)::BIGINT AS n, sum(tb)::HUGEINT AS tb, "
        "sum(tns)::HUGEINT AS tns, max(mx) AS mx, min(mn) AS mn, "
        f"sum(tb * coalesce({factor}, 0.0)) AS bus, bool_or({factor} IS NOT NULL) AS busok, "
        f"bool_and(pow2) AS pow2 FROM ({per}) GROUP BY ALL"))
    cols = [*by, "calls", "total_bytes", "total_ns", "max_ns", "bus", "busok", "pow2",
            *(f"q_{q:g}" for q in qs)]
    if hist.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    if nk:
        hist["g"] = hist.groupby(kcols, dropna=False, sort=False).ngroup()
    else:
        hist["g"] = 0
    hist = hist.sort_values(["g", "hb"], kind="stable").reset_index(drop=True)
    grp = hist.groupby("g", sort=True)
    out = grp.agg(calls=("n", "sum"), total_bytes=("tb", "sum"), total_ns=("tns", "sum"),
                  max_ns=("mx", "max"), bus=("bus", "sum"), busok=("busok", "any"),
                  pow2=("pow2", "all"))
    first = grp.head(1).set_index("g")
    for i, k in enumerate(by):
        out[k] = first[f"k_{i}"]
    values = _order_statistics(con, ds, keyed, hist, kcols, qs)
    n = out["calls"].to_numpy(dtype=np.int64)
    for q in qs:
        pos = q * np.maximum(n - 1, 0)
        lo = np.floor(pos).astype(np.int64)
        hi = np.ceil(pos).astype(np.int64)
        v_lo = np.array([values[(g, int(k))] for g, k in zip(out.index, lo)], np.float64)
        v_hi = np.array([values[(g, int(k))] for g, k in zip(out.index, hi)], np.float64)
        out[f"q_{q:g}"] = v_lo + (v_hi - v_lo) * (pos - lo)
    return out.reset_index(drop=True)[cols]


def _keyed_sql(by: Sequence[str], inner: str) -> str:
    """The calls with their keys (k_0, ...), dur_ns, bytes, comm_size, op and the
    duration's log bucket hb."""
    src = f"({inner})"
    if "bucket" in by:  # the guess column the bucket key corrects
        src = f"(SELECT *, {_pow2_guess_sql('bytes')} FROM {src})"
    keys = "".join(f"{_key_sql(k)[0]} AS k_{i}, " for i, k in enumerate(by))
    return f"SELECT {keys}dur_ns, bytes, comm_size, op, {_hb_sql('dur_ns')} AS hb FROM {src}"


def _order_statistics(con: Any, ds: Dataset, keyed: str, hist: pd.DataFrame,
                      kcols: list[str], qs: Sequence[float]) -> dict[tuple[int, int], int]:
    """(group, k) -> the k-th smallest duration of the group (0-based), for the
    order statistics the quantiles need; hist sorted by (g, hb)."""
    n_g = hist.groupby("g", sort=True)["n"].sum()
    cum = hist.groupby("g", sort=False)["n"].cumsum().to_numpy()
    below = cum - hist["n"].to_numpy()
    g_arr = hist["g"].to_numpy()
    wanted: dict[int, set[int]] = {}
    for g, n in n_g.items():
        ks: set[int] = set()
        for q in qs:
            pos = q * max(int(n) - 1, 0)
            ks.update((int(np.floor(pos)), int(np.ceil(pos))))
        wanted[int(g)] = ks
    values: dict[tuple[int, int], int] = {}
    targets: list[tuple[int, int, list[int]]] = []  # hist row, below, ks
    start = np.searchsorted(g_arr, np.arange(len(n_g)))
    stop = np.searchsorted(g_arr, np.arange(len(n_g)), side="right")
    for g, ks in wanted.items():
        rows = np.arange(start[g], stop[g])
        for row in sorted({int(rows[np.searchsorted(cum[rows], k, side="right")])
                           for k in ks}):
            mine = [k for k in ks if below[row] <= k < cum[row]]
            if int(hist.at[row, "mn"]) == int(hist.at[row, "mx"]):
                for k in mine:
                    values[(g, k)] = int(hist.at[row, "mn"])
            else:
                targets.append((row, int(below[row]), mine))
    if not targets:
        return values
    small = [t for t in targets if int(hist.at[t[0], "n"]) <= LIST_BUDGET]
    big = [t for t in targets if int(hist.at[t[0], "n"]) > LIST_BUDGET]
    if small:
        _collect(con, ds, keyed, hist, kcols, small, values, sub=False)
    if big:
        _collect(con, ds, keyed, hist, kcols, big, values, sub=True)
    return values


def _target_table(hist: pd.DataFrame, kcols: list[str],
                  targets: list[tuple[int, int, list[int]]]) -> pd.DataFrame:
    rows = [t[0] for t in targets]
    tt = hist.loc[rows, [*kcols, "hb", "mn", "mx"]].reset_index(drop=True)
    tt["tid"] = np.arange(len(tt), dtype=np.int64)
    return tt


#: at most this many duration ranges in a collecting scan's filter (else one range)
_MAX_RANGES = 256


def _within(keyed: str, tt: pd.DataFrame) -> str:
    """The calls of `keyed` whose duration lies in a target bucket's [mn, mx]: a
    filter on the raw column, which the scan applies before computing any key."""
    spans = sorted(zip(tt["mn"].astype(np.int64), tt["mx"].astype(np.int64)))
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], int(hi))
        else:
            merged.append([int(lo), int(hi)])
    if len(merged) > _MAX_RANGES:
        merged = [[merged[0][0], max(hi for _, hi in merged)]]
    cond = " OR ".join(f"(dur_ns BETWEEN {lo} AND {hi})" for lo, hi in merged)
    return f"SELECT * FROM ({keyed}) WHERE {cond}"


def _collect(con: Any, ds: Dataset, keyed: str, hist: pd.DataFrame, kcols: list[str],
             targets: list[tuple[int, int, list[int]]], values: dict[tuple[int, int], int],
             *, sub: bool) -> None:
    """Fill `values` for the targets: list the durations of each target bucket (sub:
    first narrow each bucket to the 1/4096 of its range holding each k)."""
    tt = _target_table(hist, kcols, targets)
    keyed = _within(keyed, tt)
    con.register("hvprof_targets", tt)
    try:
        on = _join_on(len(kcols), "c", "t", ["hb"])
        if not sub:
            got = query(con, ds, f"SELECT t.tid, list(c.dur_ns) AS v FROM ({keyed}) c "
                                 f"JOIN hvprof_targets t ON {on} GROUP BY t.tid")
            for tid, v in zip(got["tid"], got["v"]):
                row, below, ks = targets[int(tid)]
                arr = np.sort(np.asarray(v, dtype=np.int64))
                for k in ks:
                    values[(int(hist.at[row, "g"]), k)] = int(arr[k - below])
            return
        width = f"((t.mx - t.mn) / {_SUB_BUCKETS}.0 + 1e-9)"
        sb = f"LEAST(CAST(floor((c.dur_ns - t.mn) / {width}) AS INTEGER), {_SUB_BUCKETS - 1})"
        sh = query(con, ds, f"SELECT t.tid, {sb} AS sb, count(*) AS n, min(c.dur_ns) AS mn, "
                            f"max(c.dur_ns) AS mx FROM ({keyed}) c JOIN hvprof_targets t ON "
                            f"{on} GROUP BY ALL ORDER BY t.tid, sb")
        need: list[tuple[int, int, int, list[int]]] = []  # tid, sb, below, ks
        for tid, part in sh.groupby("tid", sort=True):
            row, below, ks = targets[int(tid)]
            g = int(hist.at[row, "g"])
            cum = below + part["n"].cumsum().to_numpy()
            for k in ks:
                i = int(np.searchsorted(cum, k, side="right"))
                r = part.iloc[i]
                if int(r["mn"]) == int(r["mx"]):
                    values[(g, k)] = int(r["mn"])
                else:
                    need.append((int(tid), int(r["sb"]), int(cum[i] - r["n"]), [k]))
        if not need:
            return
        sel = pd.DataFrame({"tid": [x[0] for x in need], "sb": [x[1] for x in need]})
        sel = sel.drop_duplicates()
        con.register("hvprof_sub", sel)
        try:
            got = query(con, ds, f"SELECT t.tid, {sb} AS sb, list(c.dur_ns) AS v FROM "
                                 f"({keyed}) c JOIN hvprof_targets t ON {on} "
                                 f"JOIN hvprof_sub s ON s.tid = t.tid AND s.sb = {sb} "
                                 "GROUP BY ALL")
        finally:
            con.unregister("hvprof_sub")
        lists = {(int(a), int(b)): np.sort(np.asarray(v, dtype=np.int64))
                 for a, b, v in zip(got["tid"], got["sb"], got["v"])}
        for tid, sbv, below, ks in need:
            row = targets[tid][0]
            arr = lists[(tid, sbv)]
            for k in ks:
                values[(int(hist.at[row, "g"]), k)] = int(arr[k - below])
    finally:
        con.unregister("hvprof_targets")


def _dataset_error(ds: Dataset, exc: Exception) -> Exception:
    text = " ".join(str(exc).split())
    if "No files found" in text or "No such file" in text:
        return NotFoundError(ds.path, f"dataset file missing: {text[:200]}")
    return CorruptError(ds.path, f"unreadable parquet dataset: {text[:300]}")


def _order_key(key: str, values: pd.Series) -> pd.Series:
    """Sort key of a grouping column, as the in-memory summary orders it."""
    from profiler.formats import record as F

    if key == "op":
        return values.map(lambda v: (F.OP_BY_NAME.get(str(v), 1 << 20), str(v)))
    if key == "dtype":
        return values.map(lambda v: (F.DTYPE_BY_NAME.get(str(v), 1 << 20), str(v)))
    if key == "kind":
        return values.map(F.kind_key)
    if key == "backend":
        order = {"mpi": 0, "app": 1, "nccl": 2}
        return values.map(lambda v: (order.get(str(v), 3), str(v)))
    return values


def finish_summary(parts: pd.DataFrame, by: Sequence[str], *,
                   comm_names: Mapping[int, str] | None = None) -> pd.DataFrame:
    """Per-group partial results (partials()) -> the table of summary.summarize:
    groups in key order, then metrics.finish, then the keys as summarize shows them."""
    by_l = list(by)
    if parts.empty:
        return empty_summary(by_l)
    df = parts.copy()
    if by_l:
        sort_cols = [f"_s{i}" for i in range(len(by_l))]
        for i, k in enumerate(by_l):
            df[sort_cols[i]] = _order_key(k, df[k])
        df = df.sort_values(sort_cols, kind="stable").drop(columns=sort_cols)
    res = finish(df.reset_index(drop=True), by_l)
    if "comm" in by_l:
        names = comm_names or {}
        res["comm"] = [f"{names[int(c)]} ({int(c):#x})" if names.get(int(c)) else f"{int(c):#x}"
                       for c in res["comm"]]
    for k in by_l:
        if k in ("op", "thread", "kind", "dtype", "backend"):
            res[k] = res[k].astype(str)
        elif k in ("bytes", "rank", "track", "step"):
            res[k] = res[k].astype(np.int64)
    return res


def comm_names(ds: Dataset, con: Any = None) -> dict[int, str]:
    """Communicator id -> name (the lowest rank's first non-null name)."""
    if "comm_name" not in ds.columns:
        return {}
    con = con or connect()
    got = query(con, ds, f"SELECT comm, arg_min(comm_name, (rank, t_start_ns)) AS name FROM "
                         f"{_source(ds)} WHERE comm_name IS NOT NULL GROUP BY comm")
    return {int(c): str(n) for c, n in zip(got["comm"], got["name"]) if n is not None}


def _by_list(by: Sequence[str] | str) -> list[str]:
    by_l = [by] if isinstance(by, str) else list(by)
    if len(set(by_l)) != len(by_l):
        raise UsageError(None, f"--by lists a key twice: {', '.join(by_l)}")
    return by_l


def _as_dataset(path: str | os.PathLike[str] | Dataset) -> Dataset:
    if isinstance(path, Dataset):
        return path
    ds = open_dataset(path)
    if ds is None:
        raise NotATraceError(path, "no parquet dataset to query (raw files only, or the "
                                   "trace's dataset is gone): use profiler.analysis.load")
    if ds.aggregated:
        raise UsageError(path, "a summary-mode trace (aggregates): use "
                               "load_aggregates/summarize_aggregates")
    return ds


def summarize_dataset(path: str | os.PathLike[str] | Dataset,
                      by: Sequence[str] | str = ("op", "bucket"), *,
                      ranks: Sequence[int] | None = None, steps: tuple[int, int] | None = None,
                      ops: Sequence[str] | None = None, kinds: Sequence[str] | None = None,
                      con: Any = None) -> pd.DataFrame:
    """summary.summarize over a whole dataset, queried in place (module doc)."""
    ds = _as_dataset(path)
    by_l = _by_list(by)
    con = con or connect()
    flt = RowFilter.of(ranks=ranks, steps=steps, ops=ops, kinds=kinds)
    parts = partials(ds, by_l, flt, con=con)
    names = comm_names(ds, con) if "comm" in by_l else None
    return finish_summary(parts, by_l, comm_names=names)


@dataclass
class Overview:
    """What `profiler summarize` prints around its table, from one scan."""

    per_rank: pd.DataFrame  # rank, kind, backend, calls, total_ns, t0, t1

    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.per_rank["rank"].unique())

    def kinds(self) -> list[str]:
        return sorted({str(k) for k in self.per_rank["kind"].unique()}, key=kind_key)

    def count(self, kind: str | None = None) -> int:
        f = self.per_rank if kind is None else self.per_rank.loc[self.per_rank["kind"] == kind]
        return int(f["calls"].sum())

    def time_ns(self, kind: str | None = None) -> float:
        f = self.per_rank if kind is None else self.per_rank.loc[self.per_rank["kind"] == kind]
        return float(f["total_ns"].sum())

    def span_ns(self) -> float:
        if self.per_rank.empty:
            return 0.0
        return float(self.per_rank["t1"].max() - self.per_rank["t0"].min())

    def per_rank_ns(self) -> pd.Series:
        return self.per_rank.groupby("rank")["total_ns"].sum().astype(np.float64)

    def nccl_calls(self) -> int:
        f = self.per_rank.loc[self.per_rank["backend"] == "nccl"]
        return int(f["calls"].sum())


def overview(path: str | os.PathLike[str] | Dataset, *, ranks: Sequence[int] | None = None,
             steps: tuple[int, int] | None = None, ops: Sequence[str] | None = None,
             kinds: Sequence[str] | None = None, con: Any = None) -> Overview:
    """Per (rank, kind, backend): calls, communication time, first start, last end."""
    ds = _as_dataset(path)
    con = con or connect()
    flt = RowFilter.of(ranks=ranks, steps=steps, ops=ops, kinds=kinds)
    cols = ["rank", "kind", "backend", "dur_ns", "t_start_ns", "t_end_ns", "op"]
    inner = calls_sql(ds, flt, device_rows=has_device_rows(con, ds), columns=cols)
    df = query(con, ds, "SELECT rank, kind, backend, count(*) AS calls, sum(dur_ns)::DOUBLE AS "
                        f"total_ns, min(t_start_ns) AS t0, max(t_end_ns) AS t1 FROM ({inner}) "
                        "GROUP BY ALL")
    for c in ("kind", "backend"):
        df[c] = df[c].astype(str)
    _memo_put(ds, "overview", df.copy(), repr(flt))
    return Overview(df)


def _ranks_with_calls(con: Any, ds: Dataset, inner: str, flt: RowFilter) -> pd.DataFrame:
    """The ranks with a call of `inner` (its filter `flt` without kinds): from an
    overview of the same filter already computed in this process, else one scan."""
    base = RowFilter.of(ranks=flt.ranks, steps=flt.steps, ops=flt.ops)
    per = _memo_get(ds, "overview", repr(base))
    if per is not None:
        if flt.kinds is not None:
            per = per.loc[per["kind"].isin(list(flt.kinds))]
        ranks = sorted({int(r) for r, n in zip(per["rank"], per["calls"]) if n > 0})
        return pd.DataFrame({"rank": np.array(ranks, dtype=np.int64)})
    return query(con, ds, f"SELECT DISTINCT rank FROM ({inner})")


# ---------------------------------------------------------------------------
# stragglers over every rank
# ---------------------------------------------------------------------------
_T_SHIFT = 1 << 63  # added to t_start_ns before it is packed with the rank


def stragglers_dataset(path: str | os.PathLike[str] | Dataset, *,
                       kinds: Sequence[str] | None = None,
                       ops: Sequence[str] | None = None, ranks: Sequence[int] | None = None,
                       steps: tuple[int, int] | None = None, min_spread_ns: int = 0,
                       con: Any = None) -> pd.DataFrame:
    """imbalance.stragglers over the whole dataset, in place: collective calls matched
    across ranks by (comm, seq) in one hash aggregation (one row per call of the
    job, not per rank), then ranked.  Same columns and order as
    imbalance.stragglers: rank, last_count, last_share, caused_wait_s,
    mean_lateness_us, gain_s, rank_order (ties in arrival: the highest rank is last,
    as the in-memory matching orders them)."""
    ds = _as_dataset(path)
    con = con or connect()
    flt = RowFilter.of(ranks=ranks, steps=steps, ops=ops, kinds=kinds)
    cols = ["rank", "comm", "seq", "comm_size", "t_start_ns"]
    inner = calls_sql(ds, flt, device_rows=False, columns=cols)
    # Arrival and rank in one key, (t_start_ns + 2**63) * 2**32 + rank (nonnegative; a
    # rank is below 2**32): ordered as (t_start_ns, rank), so that its two largest
    # give the last arrival, its rank (the highest rank of a tie) and the arrival
    # before it, in one aggregate.
    matched = (f"SELECT comm, seq, count(*) AS n, min(t_start_ns) AS first, "
               "sum(t_start_ns::HUGEINT) AS s, "
               f"max((t_start_ns::HUGEINT + {_T_SHIFT}) * 4294967296 + rank, 2) AS top "
               f"FROM ({inner}) WHERE seq >= 0 AND comm_size > 1 GROUP BY comm, seq")
    last = f"((top[1] >> 32) - {_T_SHIFT})"
    per = query(con, ds, "SELECT (top[1] & 4294967295)::BIGINT AS rank, count(*) AS last_count, "
                         f"sum(n * {last} - s)::DOUBLE / 1e9 AS caused_wait_s, "
                         f"avg({last} - first) / 1e3 AS mean_lateness_us, "
                         f"sum(CASE WHEN n >= 2 THEN (top[1] >> 32) - (top[2] >> 32) ELSE 0 END)"
                         "::DOUBLE / 1e9 AS gain_s "
                         f"FROM ({matched}) WHERE {last} - first > {int(min_spread_ns)} "
                         "GROUP BY ALL")
    everyone = _ranks_with_calls(con, ds, inner, flt)
    cols_out = ["rank", "last_count", "last_share", "caused_wait_s", "mean_lateness_us",
                "gain_s", "rank_order"]
    if everyone.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols_out})
    out = everyone.astype({"rank": np.int64}).merge(per.astype({"rank": np.int64}),
                                                     on="rank", how="left")
    out["last_count"] = out["last_count"].fillna(0).astype(np.int64)
    out["caused_wait_s"] = out["caused_wait_s"].fillna(0.0).astype(np.float64)
    out["mean_lateness_us"] = out["mean_lateness_us"].fillna(0.0).astype(np.float64)
    out["gain_s"] = out["gain_s"].fillna(0.0).astype(np.float64)
    out["last_share"] = out["last_count"] / max(int(out["last_count"].sum()), 1)
    out = out.sort_values(["caused_wait_s", "last_count", "rank"],
                          ascending=[False, False, True])
    out["rank_order"] = np.arange(1, len(out) + 1)
    return out[cols_out].reset_index(drop=True)
