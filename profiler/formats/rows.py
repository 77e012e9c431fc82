"""Raw file -> rows of the row schema (docs/ARCHITECTURE.md section 3).

`raw_to_frame` converts one rank's records: ticks -> nanoseconds on the job axis,
enum codes -> categories, communicator and track indices -> their table
entries, thread kind, call kind (Horovod classification) and step number;
`agg_to_frame` does the same for the summary-mode aggregates."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.errors import CorruptError
from profiler.formats import record as F
from profiler.formats.clock import ns_per_tick, ticks_to_job_ns
from profiler.formats.raw import AggFile, RawFile, c_string
from profiler.formats.schema import AGG_COLUMNS, COLUMNS

_OP_TENSOR = next(v for v, (name, _, _) in F.OPS.items() if name == "APP_TENSOR")
_P2P_VALUES = np.array(sorted(v for v, (_, name, _) in F.OPS.items() if name in F.P2P_OPS),
                       dtype=np.uint16)
HOROVOD_CALLERS = ("mpi_lib", "horovod")


# ---------------------------------------------------------------------------
# raw -> DataFrame
# ---------------------------------------------------------------------------
def _categorical(values: np.ndarray, namer: Callable[[int], str]) -> pd.Categorical:
    """Codes -> Categorical through a naming function applied to the unique codes."""
    uniq, inv = np.unique(values, return_inverse=True)
    names = [namer(int(u)) for u in uniq]
    cats = list(dict.fromkeys(names))
    pos = {name: i for i, name in enumerate(cats)}
    mapping = np.array([pos[n] for n in names], dtype=np.int32)
    codes = mapping[inv] if len(values) else np.zeros(0, dtype=np.int32)
    return pd.Categorical.from_codes(codes, categories=cats)


def _lookup(table_values: Sequence[Any] | np.ndarray, idx: np.ndarray, default: Any,
            dtype: Any) -> np.ndarray:
    """table_values[idx] with `default` for out-of-range indices."""
    ext = np.empty(len(table_values) + 1, dtype=dtype)
    if len(table_values):
        ext[:-1] = table_values
    ext[-1] = default
    safe = np.where(idx < len(table_values), idx, len(table_values))
    return ext[safe]


def thread_kind_of(kind: int, is_main: int, caller: str) -> str:
    if kind == F.TRACK_KIND_STREAM:
        return "stream"
    low = caller.lower()
    if any(c in low for c in HOROVOD_CALLERS):
        return "horovod"
    if is_main:
        return "main"
    return "other"


def assign_steps(rank: np.ndarray, t_start: np.ndarray, is_step: np.ndarray,
                 step_start: np.ndarray, step_end: np.ndarray,
                 step_no: np.ndarray) -> np.ndarray:
    """Step number of each row: the APP_STEP interval [start, end) on its rank
    that contains its t_start, else -1.  Step rows get their own number."""
    out = np.full(len(t_start), -1, dtype=np.int32)
    step_rank = rank[is_step]
    for r in np.unique(step_rank):
        sel = step_rank == r
        s, e, n = step_start[sel], step_end[sel], step_no[sel]
        order = np.argsort(s, kind="stable")
        s, e, n = s[order], e[order], n[order]
        rows = np.flatnonzero(rank == r)
        t = t_start[rows]
        i = np.searchsorted(s, t, side="right") - 1
        ok = i >= 0
        ii = np.where(ok, i, 0)
        ok &= t < e[ii]
        out[rows[ok]] = n[ii[ok]]
    out[np.flatnonzero(is_step)] = step_no.astype(np.int32)
    return out


#: How a frame's rows are classified (profiler.postjob.classify.classify: a
#: categorical Series, a frame with a "kind" column, or one kind per row).
Classifier = Callable[[pd.DataFrame], Any]


def _classify(df: pd.DataFrame, classify: Classifier | None) -> pd.Categorical:
    """kind column: classify(df); without a classifier, app rows are "app" and the
    rest "data" (the formats hold no policy)."""
    if classify is None:
        kind = np.where(df["backend"].to_numpy(dtype=object) == "app", "app", "data")
        return pd.Categorical(kind, categories=list(F.CALL_KINDS))
    result = classify(df)
    if isinstance(result, pd.DataFrame):
        result = result["kind"]
    if isinstance(result, pd.Series) and isinstance(result.dtype, pd.CategoricalDtype):
        if len(result) != len(df):
            raise CorruptError(None, f"classify() returned {len(result)} kinds for "
                                     f"{len(df)} rows")
        return pd.Categorical(result.array)
    values = np.asarray(result, dtype=object)
    if len(values) != len(df):
        raise CorruptError(None, f"classify() returned {len(values)} kinds for {len(df)} rows")
    return pd.Categorical(values)


def _table_columns(raw: RawFile, comm_idx: np.ndarray,
                   track_idx: np.ndarray) -> dict[str, Any]:
    """Columns looked up in the communicator and track tables."""
    comms = raw.comms
    comm_names = [c_string(b) for b in comms["name"]]
    tracks = raw.tracks
    tkinds = [thread_kind_of(int(k), int(m), c_string(c))
              for k, m, c in zip(tracks["kind"], tracks["is_main"], tracks["caller"])]
    tnames = [c_string(b) for b in tracks["name"]]

    def comm_name_of(i: int) -> str:
        return comm_names[i] if 0 <= i < len(comm_names) else ""

    def tkind_of(i: int) -> str:
        return tkinds[i] if 0 <= i < len(tkinds) else "other"

    def tname_of(i: int) -> str:
        return tnames[i] if 0 <= i < len(tnames) else ""

    return {
        "comm": _lookup(comms["id"], comm_idx, 0, np.uint64),
        "comm_size": _lookup(comms["size"], comm_idx, -1, np.int32),
        "comm_rank": _lookup(comms["rank"], comm_idx, -1, np.int32),
        "comm_name": _categorical(comm_idx, comm_name_of),
        "tid": _lookup(tracks["tid"], track_idx, -1, np.int32),
        "thread_kind": _categorical(track_idx, tkind_of),
        "thread_name": _categorical(track_idx, tname_of),
    }


_OP_NET = 73  # NCCL_NET: auxiliary records of the plugin path (hvprof_format.h)
NET_COLUMNS = ("net_send_bytes", "net_recv_bytes", "net_ns", "net_steps")


def _net_columns(rec: np.ndarray, net: np.ndarray, h: Any) -> dict[str, np.ndarray]:
    """The NCCL_NET records folded into the columns of the calls they describe
    (same comm index and seq, a host NCCL row other than a group): bytes sent
    and received on the network, the proxy activity's span, proxy steps.
    Calls without one get -1."""
    n = len(rec)
    out = {c: np.full(n, -1, dtype=np.int64) for c in NET_COLUMNS}
    ops = rec["op"].astype(np.int64)
    cand = ((ops >= 64) & (ops < 72) & ((rec["flags"].astype(np.int64) & F.FLAG_DEVICE) == 0))
    idx = np.flatnonzero(cand)
    if not len(idx) or not len(net):
        return out
    key = (rec["comm"][idx].astype(np.uint64) << np.uint64(32)) | rec["seq"][idx].astype(np.uint64)
    nkey = (net["comm"].astype(np.uint64) << np.uint64(32)) | net["seq"].astype(np.uint64)
    order = np.argsort(key, kind="stable")
    pos = np.searchsorted(key[order], nkey)
    ok = pos < len(order)
    ok[ok] = key[order][pos[ok]] == nkey[ok]
    rows = idx[order[pos[ok]]]
    sel = net[ok]
    t0 = ticks_to_job_ns(sel["t_start"], h)
    t1 = ticks_to_job_ns(sel["t_end"], h)
    out["net_send_bytes"][rows] = sel["bytes"].astype(np.int64)
    out["net_recv_bytes"][rows] = sel["count"].astype(np.int64)
    out["net_ns"][rows] = np.maximum(t1 - t0, 0)
    out["net_steps"][rows] = sel["root"].astype(np.int64)
    return out


def raw_to_frame(raw: RawFile, classify: Classifier | None = None) -> pd.DataFrame:
    """One rank's records as a DataFrame with the row schema, sorted by t_start_ns
    (kind: see _classify).
    NCCL_NET records (the plugin path's network activity per NCCL call) are not
    rows: where there are any, they become the net_* columns of their calls."""
    rec = raw.records
    h = raw.header
    is_net = rec["op"] == _OP_NET
    net_cols: dict[str, np.ndarray] | None = None
    if is_net.any():
        net = rec[is_net]
        rec = rec[~is_net]
        net_cols = _net_columns(rec, net, h)
    n = len(rec)
    t_start = ticks_to_job_ns(rec["t_start"], h)
    t_end = ticks_to_job_ns(rec["t_end"], h)
    t_end = np.where(rec["t_end"] < rec["t_start"], t_start, t_end)
    flags = rec["flags"].astype(np.int32)

    comm_idx = rec["comm"].astype(np.int64)
    track_idx = rec["track"].astype(np.int64)
    ctx = _table_columns(raw, comm_idx, track_idx)

    op_vals = rec["op"]
    backend = _categorical(op_vals, F.op_backend)
    backend_arr = np.asarray(backend, dtype=object) if n else np.zeros(0, dtype=object)
    is_nccl = backend_arr == "nccl"
    group = np.where(is_nccl & ((flags & F.FLAG_DEVICE) == 0), rec["aux"], 0).astype(np.int32)
    # MPI records: the receive buffer; Gloo records: the buffer (data ops);
    # APP_TENSOR: the tensor's output (all folded to 32 bits, hvprof_fold_ptr);
    # 0 for everything else
    buf = np.where((backend_arr == "mpi") | (backend_arr == "gloo") | (op_vals == _OP_TENSOR),
                   rec["aux"], 0).astype(np.int64)

    # MPI point-to-point: the record's seq is the tag (int32 bits); such rows
    # have no sequence number (-1), every other row no tag (-1)
    p2p = np.isin(op_vals, _P2P_VALUES)
    seq = np.where(p2p, -1, rec["seq"].astype(np.int64))
    tag = np.where(p2p, rec["seq"].view(np.int32) if n else np.zeros(0, np.int32), -1)

    rank = np.full(n, int(h["rank"]), dtype=np.int32)
    df = pd.DataFrame(
        {
            "rank": rank,
            "backend": backend,
            "op": _categorical(op_vals, F.op_name),
            "t_start_ns": t_start,
            "t_end_ns": t_end,
            "dur_ns": t_end - t_start,
            "bytes": rec["bytes"].astype(np.int64),
            "count": rec["count"].astype(np.int64),
            "dtype": _categorical(rec["dtype"], F.dtype_name),
            "dtype_size": rec["dtype_size"].astype(np.int32),
            "redop": _categorical(rec["redop"], F.redop_name),
            "flags": flags,
            "in_place": (flags & F.FLAG_IN_PLACE) != 0,
            "device": (flags & F.FLAG_DEVICE) != 0,
            "rc": rec["rc"].astype(np.int16),
            "comm": ctx["comm"],
            "comm_size": ctx["comm_size"],
            "comm_rank": ctx["comm_rank"],
            "comm_name": ctx["comm_name"],
            "root": rec["root"].astype(np.int32),
            "seq": seq,
            "tag": tag.astype(np.int32),
            "track": track_idx.astype(np.int32),
            "tid": ctx["tid"],
            "thread_kind": ctx["thread_kind"],
            "thread_name": ctx["thread_name"],
            "group": group,
            "buf": buf,
            **(net_cols or {}),
        }
    )
    order = np.argsort(t_start, kind="stable")
    if n and not (order == np.arange(n)).all():
        df = df.iloc[order].reset_index(drop=True)
    is_step = (df["op"] == "step").to_numpy()
    ts = df["t_start_ns"].to_numpy()
    step = assign_steps(
        df["rank"].to_numpy(), ts, is_step, ts[is_step],
        df["t_end_ns"].to_numpy()[is_step], df["seq"].to_numpy()[is_step],
    )
    # APP_CPU rows (a thread's CPU and run-queue time since its previous read,
    # written with a step record): the step they close, whatever their start
    is_cpu = (df["op"] == "cpu").to_numpy()
    if is_cpu.any():
        step[is_cpu] = df["seq"].to_numpy()[is_cpu].astype(np.int32)
    df["step"] = step
    df.insert(len(df.columns) - 1, "kind", _classify(df, classify))
    return df[[c for c in COLUMNS if c in df.columns]
              + [c for c in df.columns if c not in COLUMNS]]


def agg_to_frame(agg: AggFile, raw: RawFile,
                 classify: Classifier | None = None) -> pd.DataFrame:
    """Summary-mode aggregates (one row per thread x op x comm x size x dtype x redop).

    total/min/max in ns; first_ns = start of the first call on the job axis;
    hist = the latency histogram in ticks (bucket b: profiler.formats.record.agg_bucket),
    ns_per_tick converts its bounds."""
    e = agg.entries
    h = raw.header
    n = len(e)
    scale = ns_per_tick(h)
    comm_idx = e["comm"].astype(np.int64)
    track_idx = e["track"].astype(np.int64)
    ctx = _table_columns(raw, comm_idx, track_idx)
    df = pd.DataFrame({
        "rank": np.full(n, int(h["rank"]), dtype=np.int32),
        "backend": _categorical(e["op"], F.op_backend),
        "op": _categorical(e["op"], F.op_name),
        "bytes": e["bytes"].astype(np.int64),
        "dtype": _categorical(e["dtype"], F.dtype_name),
        "redop": _categorical(e["redop"], F.redop_name),
        "flags": e["flags_or"].astype(np.int32),
        **{k: ctx[k] for k in ("comm", "comm_size", "comm_rank", "comm_name")},
        "track": track_idx.astype(np.int32),
        **{k: ctx[k] for k in ("tid", "thread_kind", "thread_name")},
        "calls": e["calls"].astype(np.int64),
        "errors": e["errors"].astype(np.int32),
        "total_ns": np.rint(e["sum_ticks"] * scale).astype(np.int64),
        "min_ns": np.rint(e["min_ticks"] * scale).astype(np.int64),
        "max_ns": np.rint(e["max_ticks"] * scale).astype(np.int64),
        "first_ns": ticks_to_job_ns(e["first_ticks"], h),
        "ns_per_tick": np.full(n, scale, dtype=np.float64),
        "hist": list(e["hist"].astype(np.int64)),
    })
    df.insert(AGG_COLUMNS.index("kind"), "kind", _classify(df, classify))
    return df.sort_values(["op", "bytes"], kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------
# metadata
# ---------------------------------------------------------------------------
def comm_table(raw: RawFile) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "id": int(c["id"]),
            "size": int(c["size"]),
            "rank": int(c["rank"]),
            "world_rank0": int(c["world_rank0"]),
            "backend": F.COMM_BACKENDS.get(int(c["backend"]), str(int(c["backend"]))),
            "valid": bool(c["valid"]),
            "name": c_string(c["name"]),
            "handle": int(c["handle"]),
        }
        for i, c in enumerate(raw.comms)
    ]


def track_table(raw: RawFile) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "tid": int(t["tid"]),
            "kind": "stream" if int(t["kind"]) == F.TRACK_KIND_STREAM else "thread",
            "thread_kind": thread_kind_of(int(t["kind"]), int(t["is_main"]),
                                          c_string(t["caller"])),
            "valid": bool(t["valid"]),
            "is_main": bool(t["is_main"]),
            "device": int(t["device"]),
            "name": c_string(t["name"]),
            "caller": c_string(t["caller"]),
            "handle": int(t["handle"]),
        }
        for i, t in enumerate(raw.tracks)
    ]


def empty_frame(columns: Sequence[str] | None = None) -> pd.DataFrame:
    """An empty DataFrame with the row schema's dtypes."""
    w = RawFile(path=Path("."), header={"rank": 0, "clock_kind": 2, "offset_ns": 0,
                                         "job_t0_ns": 0}, comms=np.zeros(0, F.COMM_ENTRY_DTYPE),
                tracks=np.zeros(0, F.TRACK_ENTRY_DTYPE), records=np.zeros(0, F.RECORD_DTYPE))
    df = raw_to_frame(w)
    return df if columns is None else df[[c for c in dict.fromkeys(columns) if c in df.columns]]
