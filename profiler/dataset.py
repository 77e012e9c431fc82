"""Raw file -> per-rank DataFrame (row schema of docs/ARCHITECTURE.md section 3).

`raw_to_frame` converts one rank's records: ticks -> nanoseconds on the job axis,
enum codes -> categories, communicator and track indices -> their table
entries, thread kind, call kind (Horovod classification hook) and step number.
`convert_raw` writes `ranks/rank-RRRRR.parquet` and `ranks/rank-RRRRR.json`
(parquet first, then the json, each by an atomic rename: a json file means the
rank's dataset is complete).  `read_dataset` reads parquet files back with
pyarrow.dataset, pushing a rank filter down.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from profiler import _format as F
from profiler import gpu
from profiler._version import __version__
from profiler.errors import CorruptError, NotATraceError, NotFoundError
from profiler.raw import (
    AggFile,
    RawFile,
    agg_path_for,
    printable,
    read_agg,
    read_header,
    read_raw,
    writer_state,
)

ENV_PREFIXES = ("HOROVOD_", "NCCL_", "OMPI_MCA_", "MPICH_", "UCX_")
# Set by mpirun for its own plumbing (daemon URIs, job ids, session dirs,
# transport keys): not communication knobs, and not worth leaking.
ENV_LAUNCHER_INTERNAL = ("OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix",
                         "OMPI_MCA_initial_wdir", "OMPI_MCA_shmem_RUNTIME_QUERY_hint")
HOROVOD_CALLERS = ("mpi_lib", "horovod")

COLUMNS = [
    "rank", "backend", "op", "t_start_ns", "t_end_ns", "dur_ns", "bytes", "count",
    "dtype", "dtype_size", "redop", "flags", "in_place", "device", "rc", "comm",
    "comm_size", "comm_rank", "comm_name", "root", "seq", "track", "tid",
    "thread_kind", "thread_name", "group", "kind", "step",
]
CATEGORY_COLUMNS = ("backend", "op", "dtype", "redop", "comm_name", "thread_kind",
                    "thread_name", "kind")
_DICT_TYPE = pa.dictionary(pa.int32(), pa.string())


# ---------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------
def rank_stem(rank: int) -> str:
    return f"rank-{rank:05d}"


def raw_path(profile_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(profile_dir) / "raw" / f"{rank_stem(rank)}.hvprof"


def parquet_path(profile_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(profile_dir) / "ranks" / f"{rank_stem(rank)}.parquet"


def meta_path(profile_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(profile_dir) / "ranks" / f"{rank_stem(rank)}.json"


def env_whitelist(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Only the variables that shape communication; nothing else ever leaves."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items())
            if k.startswith(ENV_PREFIXES) and not k.startswith(ENV_LAUNCHER_INTERNAL)}


# ---------------------------------------------------------------------------
# time conversion
# ---------------------------------------------------------------------------
def ns_per_tick(header: Mapping[str, Any]) -> float:
    """Nanoseconds per raw tick: 1 for CLOCK_MONOTONIC, else from the calibration
    pairs (cal1 later than cal0), else 1 / ticks_per_ns."""
    if int(header.get("clock_kind", 0)) == 2:
        return 1.0
    c0t, c0n = int(header["cal0_ticks"]), int(header["cal0_mono_ns"])
    c1t, c1n = int(header["cal1_ticks"]), int(header["cal1_mono_ns"])
    if c1t > c0t and c1n > c0n:
        return (c1n - c0n) / (c1t - c0t)
    tpn = float(header.get("ticks_per_ns") or 0.0)
    return 1.0 / tpn if tpn > 0 else 1.0


def ticks_to_mono_ns(ticks: np.ndarray, header: Mapping[str, Any]) -> np.ndarray:
    """Raw ticks -> this rank's CLOCK_MONOTONIC nanoseconds (int64).

    With two calibration pairs (cal1 later than cal0) the slope comes from
    them; otherwise from ticks_per_ns.  CLOCK_MONOTONIC ticks are already ns.
    """
    t = np.asarray(ticks).astype(np.int64, copy=False)
    if int(header.get("clock_kind", 0)) == 2:
        return t.copy()
    c0t, c0n = int(header["cal0_ticks"]), int(header["cal0_mono_ns"])
    return c0n + np.rint((t - c0t) * ns_per_tick(header)).astype(np.int64)


# Clocks of different hosts drift apart by at most a few hundred ppm (NTP
# keeps them within 500 ppm); a larger drift between the two measurements is
# a corrupt header or a stepped clock: the start-up offset is used alone.
MAX_DRIFT_PPM = 1000.0


def clock_drift_ppm(header: Mapping[str, Any]) -> float | None:
    """How fast this rank's clock ran against rank 0's between the offset
    measurements at MPI_Init and MPI_Finalize (parts per million; None when it
    was measured once: one host, or an older file).

    Drift is reported only when it is significant: the two offsets must differ
    by more than the sum of their error bounds (offset_err_ns,
    offset_end_err_ns), so that no offset consistent with both measurements
    stands still over the run.  Otherwise the clocks are not known to drift
    over this run's length and the drift is 0.0 (see offset_ns_at)."""
    t0, t1 = int(header.get("offset_at_ns") or 0), int(header.get("offset_end_at_ns") or 0)
    if t0 <= 0 or t1 <= t0:
        return None
    d = int(header.get("offset_end_ns") or 0) - int(header["offset_ns"])
    bound = (abs(int(header.get("offset_err_ns") or 0))
             + abs(int(header.get("offset_end_err_ns") or 0)))
    if abs(d) <= bound:
        return 0.0
    ppm = d / (t1 - t0) * 1e6
    return ppm if abs(ppm) <= MAX_DRIFT_PPM else None


def agreed_offset_ns(header: Mapping[str, Any]) -> tuple[int, int]:
    """(offset, error bound) of this rank's clock to rank 0's when it does not
    drift: the middle of the offsets consistent with both measurements (the
    intersection of [offset +- err] at MPI_Init and at MPI_Finalize), or the
    start-up measurement alone when there is one measurement, the two do not
    agree, or the drift was refused (clock_drift_ppm)."""
    o0, e0 = int(header["offset_ns"]), abs(int(header.get("offset_err_ns") or 0))
    if clock_drift_ppm(header) != 0.0 or not int(header.get("offset_end_at_ns") or 0):
        return o0, e0
    o1, e1 = int(header.get("offset_end_ns") or 0), abs(int(header.get("offset_end_err_ns") or 0))
    lo, hi = max(o0 - e0, o1 - e1), min(o0 + e0, o1 + e1)
    if lo > hi:
        return o0, e0
    return (lo + hi) // 2, (hi - lo + 1) // 2


def offset_ns_at(mono_ns: np.ndarray, header: Mapping[str, Any]) -> np.ndarray | int:
    """This rank's offset to rank 0's clock at its own CLOCK_MONOTONIC times:
    with significant drift (clock_drift_ppm), the start-up offset moved
    linearly to the one measured at MPI_Finalize; without, one offset for the
    run, the best that both measurements allow (agreed_offset_ns)."""
    ppm = clock_drift_ppm(header)
    if ppm is None or ppm == 0.0:
        return agreed_offset_ns(header)[0]
    o0 = int(header["offset_ns"])
    t0 = int(header["offset_at_ns"])
    return o0 + np.rint((np.asarray(mono_ns) - t0) * (ppm * 1e-6)).astype(np.int64)


def ticks_to_job_ns(ticks: np.ndarray, header: Mapping[str, Any]) -> np.ndarray:
    """Raw ticks -> job axis: rank 0's monotonic clock minus job_t0_ns (this rank's
    clock offset applied, interpolated between its two measurements)."""
    mono = ticks_to_mono_ns(ticks, header)
    return mono - offset_ns_at(mono, header) - int(header["job_t0_ns"])


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


def _decode(b: bytes) -> str:
    """A name from a raw table (communicator, thread, caller), as printable text."""
    return printable(b.split(b"\0", 1)[0].decode("utf-8", "replace"))


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


def _classify(df: pd.DataFrame) -> pd.Categorical:
    """kind column: profiler.horovod.classify.classify(df) when it exists."""
    try:
        from profiler.horovod.classify import classify
    except ImportError:
        kind = np.where(df["backend"].to_numpy(dtype=object) == "app", "app", "data")
        return pd.Categorical(kind, categories=["data", "control", "app"])
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
    comm_names = [_decode(b) for b in comms["name"]]
    tracks = raw.tracks
    tkinds = [thread_kind_of(int(k), int(m), _decode(c))
              for k, m, c in zip(tracks["kind"], tracks["is_main"], tracks["caller"])]
    tnames = [_decode(b) for b in tracks["name"]]

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


def raw_to_frame(raw: RawFile) -> pd.DataFrame:
    """One rank's records as a DataFrame with the row schema, sorted by t_start_ns."""
    rec = raw.records
    h = raw.header
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
            "seq": rec["seq"].astype(np.int64),
            "track": track_idx.astype(np.int32),
            "tid": ctx["tid"],
            "thread_kind": ctx["thread_kind"],
            "thread_name": ctx["thread_name"],
            "group": group,
        }
    )
    order = np.argsort(t_start, kind="stable")
    if n and not (order == np.arange(n)).all():
        df = df.iloc[order].reset_index(drop=True)
    is_step = (df["op"] == "step").to_numpy()
    ts = df["t_start_ns"].to_numpy()
    df["step"] = assign_steps(
        df["rank"].to_numpy(), ts, is_step, ts[is_step],
        df["t_end_ns"].to_numpy()[is_step], df["seq"].to_numpy()[is_step],
    )
    df.insert(len(df.columns) - 1, "kind", _classify(df))
    return df[[c for c in COLUMNS if c in df.columns]
              + [c for c in df.columns if c not in COLUMNS]]


AGG_COLUMNS = [
    "rank", "backend", "op", "bytes", "dtype", "redop", "flags", "comm", "comm_size",
    "comm_rank", "comm_name", "track", "tid", "thread_kind", "thread_name", "kind", "calls",
    "errors", "total_ns", "min_ns", "max_ns", "first_ns", "ns_per_tick", "hist",
]


def agg_to_frame(agg: AggFile, raw: RawFile) -> pd.DataFrame:
    """Summary-mode aggregates (one row per thread x op x comm x size x dtype x redop).

    total/min/max in ns; first_ns = start of the first call on the job axis;
    hist = the latency histogram in ticks (bucket b: profiler._format.agg_bucket),
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
    df.insert(AGG_COLUMNS.index("kind"), "kind", _classify(df))
    return df.sort_values(["op", "bytes"], kind="stable").reset_index(drop=True)


def agg_parquet_path(profile_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(profile_dir) / "ranks" / f"{rank_stem(rank)}.agg.parquet"


# ---------------------------------------------------------------------------
# metadata
# ---------------------------------------------------------------------------
def _comm_table(raw: RawFile) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "id": int(c["id"]),
            "size": int(c["size"]),
            "rank": int(c["rank"]),
            "world_rank0": int(c["world_rank0"]),
            "backend": F.COMM_BACKENDS.get(int(c["backend"]), str(int(c["backend"]))),
            "valid": bool(c["valid"]),
            "name": _decode(c["name"]),
            "handle": int(c["handle"]),
        }
        for i, c in enumerate(raw.comms)
    ]


def _track_table(raw: RawFile) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "tid": int(t["tid"]),
            "kind": "stream" if int(t["kind"]) == F.TRACK_KIND_STREAM else "thread",
            "thread_kind": thread_kind_of(int(t["kind"]), int(t["is_main"]),
                                          _decode(t["caller"])),
            "valid": bool(t["valid"]),
            "is_main": bool(t["is_main"]),
            "device": int(t["device"]),
            "name": _decode(t["name"]),
            "caller": _decode(t["caller"]),
            "handle": int(t["handle"]),
        }
        for i, t in enumerate(raw.tracks)
    ]


def comm_total_ns(df: pd.DataFrame) -> int:
    """This rank's time in communication calls (host rows; no set-up calls, no
    application rows).  The rank that arrives last waits least: trace.json's
    event window uses this to show likely stragglers without reading records."""
    if not len(df) or "op" not in df.columns:
        return 0
    mask = (df["backend"] != "app").to_numpy(dtype=bool) & ~df["op"].isin(
        ["init", "finalize"]).to_numpy(dtype=bool)
    if "device" in df.columns:
        mask = mask & ~df["device"].to_numpy(dtype=bool)
    return int(df["dur_ns"].to_numpy()[mask].sum())


def step_totals(df: pd.DataFrame) -> dict[str, Any]:
    """This rank's steps (op "step" rows; count = images): how many, how many
    carried images (warm-up steps carry 0), images, seconds, images/sec and the
    batch size (the most common images per step)."""
    if not len(df) or "op" not in df.columns:
        return {"steps": 0}
    st = df.loc[(df["op"] == "step").to_numpy(dtype=bool)]
    timed = st.loc[st["count"].to_numpy() > 0]
    out: dict[str, Any] = {"steps": int(len(st)), "timed_steps": int(len(timed))}
    if len(timed):
        images = int(timed["count"].sum())
        seconds = float(timed["dur_ns"].sum()) / 1e9
        out.update(images=images, seconds=seconds,
                   images_per_sec=images / seconds if seconds > 0 else None,
                   batch_size=int(timed["count"].mode().iloc[0]))
    return out


def rank_metadata(raw: RawFile, df: pd.DataFrame, *, own_process: bool,
                  agg: pd.DataFrame | None = None,
                  problems: Sequence[str] = ()) -> dict[str, Any]:
    """The ranks/rank-R.json document.  env/argv only when this process is the rank.

    calls = per-call rows (application rows excluded) + summary-mode aggregated calls."""
    st = raw.path.stat()
    ap = agg_path_for(raw.path)
    ast = ap.stat() if ap.is_file() else None
    per_call = int((df["backend"] != "app").sum()) if len(df) else 0
    aggregated = int(agg["calls"].sum()) if agg is not None and len(agg) else 0
    mode = F.MODES.get(int(raw.header.get("mode", 0)), "unknown")
    return {
        "rank": raw.rank,
        "profiler_version": __version__,
        "format_version": F.FORMAT_VERSION,
        "header": raw.header,
        "host": raw.header["hostname"],
        "comms": _comm_table(raw),
        "tracks": _track_table(raw),
        "calls": per_call + aggregated,
        "steps": step_totals(df),
        "totals": {"comm_ns": comm_total_ns(df)},
        "rows": len(df),
        "mode": mode,
        "aggregated_calls": aggregated,
        "unsampled_calls": int(raw.header.get("unsampled_calls", 0)),
        "aggregates": (agg_parquet_path(".", raw.rank).name if agg is not None else None),
        "problems": [*raw.problems, *problems],
        **gpu.process_metadata(raw.path, own_process=own_process),
        "env": env_whitelist() if own_process else None,
        "argv": list(sys.argv) if own_process else None,
        "executable": sys.executable if own_process else None,
        "parquet": parquet_path(".", raw.rank).name,
        "source": {
            "raw": f"raw/{raw.path.name}",
            "raw_size": st.st_size,
            "raw_mtime_ns": st.st_mtime_ns,
            "state": raw.state,
            "n_chunks": int(raw.header["n_chunks"]),
            "agg_size": ast.st_size if ast else None,
            "agg_mtime_ns": ast.st_mtime_ns if ast else None,
            "converted_by": "self" if own_process else f"pid {os.getpid()} on "
            f"{socket.gethostname()}",
            "converted_at": time.time(),
        },
    }


# ---------------------------------------------------------------------------
# write / read
# ---------------------------------------------------------------------------
def frame_to_table(df: pd.DataFrame) -> pa.Table:
    """DataFrame -> arrow table with int32-indexed string dictionaries everywhere."""
    # nthreads=1: from_pandas would otherwise convert large frames on a Python
    # ThreadPoolExecutor, which refuses work once the interpreter is shutting
    # down ("cannot schedule new futures after interpreter shutdown"): the
    # exit work of any job that imported concurrent.futures (torch does).
    table = pa.Table.from_pandas(df, preserve_index=False, nthreads=1)
    fields = []
    for f in table.schema:
        fields.append(pa.field(f.name, _DICT_TYPE) if pa.types.is_dictionary(f.type) else f)
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


# Times, sequence and step numbers grow within a rank: delta encoding (instead of
# dictionaries) halves the dataset, 24 -> 12 bytes per row at 100k calls per rank.
DELTA_COLUMNS = ("t_start_ns", "t_end_ns", "dur_ns", "seq", "step")


def write_parquet(table: pa.Table, path: str | os.PathLike[str]) -> None:
    """Write a rank's rows as the dataset stores them (zstd, delta-encoded times)."""
    names = table.schema.names
    delta = [c for c in DELTA_COLUMNS if c in names]
    pq.write_table(table, path, compression="zstd",
                   use_dictionary=[c for c in names if c not in delta],
                   column_encoding={c: "DELTA_BINARY_PACKED" for c in delta})


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@dataclass
class Converted:
    rank: int
    parquet: Path
    meta: Path
    calls: int
    rows: int
    complete: bool
    problems: list[str]


def convert_raw(path: str | os.PathLike[str], profile_dir: str | os.PathLike[str] | None = None,
                *, own_process: bool = False) -> Converted:
    """raw/rank-R.hvprof -> ranks/rank-R.parquet + ranks/rank-R.json."""
    raw = read_raw(path)
    base = Path(profile_dir) if profile_dir is not None else Path(path).resolve().parent.parent
    df = raw_to_frame(raw)
    agg_df, problems = None, []
    if int(raw.header.get("mode", 0)) == F.MODE_SUMMARY:
        ap = agg_path_for(path)
        if ap.is_file():
            agg = read_agg(ap)
            agg_df = agg_to_frame(agg, raw)
            problems = list(agg.problems)
        else:
            problems = ["summary mode, but no aggregate file (killed before its first "
                        "snapshot?)"]
    meta = rank_metadata(raw, df, own_process=own_process, agg=agg_df, problems=problems)
    pq_out = parquet_path(base, raw.rank)
    js_out = meta_path(base, raw.rank)
    pq_out.parent.mkdir(parents=True, exist_ok=True)
    table = frame_to_table(df)
    if agg_df is not None:
        agg_table = frame_to_table(agg_df)
        _atomic_write(agg_parquet_path(base, raw.rank),
                      lambda p: pq.write_table(agg_table, p, compression="zstd"))
    _atomic_write(pq_out, lambda p: write_parquet(table, p))
    _atomic_write(js_out, lambda p: p.write_bytes(
        orjson.dumps(meta, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)))
    return Converted(rank=raw.rank, parquet=pq_out, meta=js_out, calls=meta["calls"],
                     rows=len(df), complete=raw.complete, problems=meta["problems"])


MAX_META_BYTES = 64 << 20  # a rank's metadata is a few KiB (tables of 1024 entries: ~300 KiB)
_INT64 = 1 << 63
# Fields the readers compute with: a document whose fields have other types is
# refused here rather than failing somewhere downstream.
_META_COUNTS = ("calls", "rows", "aggregated_calls", "unsampled_calls")
_META_LISTS = ("comms", "tracks")
_META_STRINGS = ("host", "mode", "profiler_version", "parquet", "aggregates", "executable")
_HEADER_INTS = ("world_size", "state", "dropped_records", "pid", "n_chunks", "job_id",
                "offset_ns", "offset_err_ns", "job_t0_ns", "local_rank", "thread_level",
                "clock_kind", "offset_method", "mode", "unsampled_calls", "aggregated_calls",
                "rank", "n_comms", "n_tracks", "cal0_realtime_ns", "offset_at_ns",
                "offset_end_ns", "offset_end_err_ns", "offset_end_at_ns")
_HEADER_STRINGS = ("hostname", "mpi_version", "clock")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64 * 2


def check_meta(p: Path, data: Any) -> dict[str, Any]:
    """Refuse a rank metadata document whose fields have the wrong types."""
    if not isinstance(data, dict) or "header" not in data or "rank" not in data:
        raise NotATraceError(p, "not a horovod-profiler rank metadata file")

    def bad(what: str) -> CorruptError:
        return CorruptError(p, f"corrupt rank metadata: {what}")

    rank = data["rank"]
    if not _is_int(rank) or not 0 <= rank < 1 << 31:
        raise bad(f"rank {rank!r}")
    h = data["header"]
    if not isinstance(h, dict):
        raise bad("header is not an object")
    for k in _HEADER_INTS:
        if k in h and not _is_int(h[k]):
            raise bad(f"header.{k} = {h[k]!r}")
    for k in _HEADER_STRINGS:
        if k in h and not isinstance(h[k], str):
            raise bad(f"header.{k} = {h[k]!r}")
    if "ticks_per_ns" in h and not (isinstance(h["ticks_per_ns"], (int, float))
                                    and not isinstance(h["ticks_per_ns"], bool)):
        raise bad(f"header.ticks_per_ns = {h['ticks_per_ns']!r}")
    if not isinstance(h.get("state_names", []), list):
        raise bad("header.state_names is not a list")
    for k in _META_COUNTS:
        if k in data and not (_is_int(data[k]) and data[k] >= 0):
            raise bad(f"{k} = {data[k]!r}")
    for k in _META_STRINGS:
        if data.get(k) is not None and not isinstance(data[k], str):
            raise bad(f"{k} = {data[k]!r}")
    for k in _META_LISTS:
        rows = data.get(k, [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise bad(f"{k} is not a list of objects")
        for i, r in enumerate(rows):
            for f in ("index", "tid", "id", "size", "rank", "device"):
                if f in r and not _is_int(r[f]):
                    raise bad(f"{k}[{i}].{f} = {r[f]!r}")
            if "name" in r and not isinstance(r["name"], str):
                raise bad(f"{k}[{i}].name = {r['name']!r}")
    if not isinstance(data.get("problems", []), list):
        raise bad("problems is not a list")
    if data.get("env") is not None and not isinstance(data["env"], dict):
        raise bad("env is not an object")
    if data.get("argv") is not None and not isinstance(data["argv"], list):
        raise bad("argv is not a list")
    for k in ("totals", "source", "nccl", "gpus"):
        if data.get(k) is not None and not isinstance(data[k], (dict, list)):
            raise bad(f"{k} = {data[k]!r}")
    for i, r in enumerate(data.get("tracks", [])):
        if not _is_int(r.get("index")):
            raise bad(f"tracks[{i}] has no index")
    for k in ("steps", "totals"):  # counters and rates computed with downstream
        block = data.get(k)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise bad(f"{k} = {block!r}")
        for f, v in block.items():
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                      and abs(v) < _INT64):
                raise bad(f"{k}.{f} = {v!r}")
    return data


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A ranks/rank-R.json document (types checked: see check_meta)."""
    from profiler.raw import read_regular

    p = Path(path)
    raw = read_regular(p, "a rank metadata file", MAX_META_BYTES)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise NotATraceError(p, "not a rank metadata file (not JSON)") from None
    return check_meta(p, data)


def is_up_to_date(raw: str | os.PathLike[str],
                  profile_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when the raw file's parquet + json exist and describe its current state."""
    rp = Path(raw)
    base = Path(profile_dir) if profile_dir is not None else rp.resolve().parent.parent
    try:
        header = read_header(rp)
        rank = int(header["rank"])
        if not parquet_path(base, rank).is_file():
            return False
        src = read_meta(meta_path(base, rank)).get("source", {})
        st = rp.stat()
        ap = agg_path_for(rp)
        ast = ap.stat() if ap.is_file() else None
    except Exception:
        return False
    if (src.get("agg_size"), src.get("agg_mtime_ns")) != (
            (ast.st_size, ast.st_mtime_ns) if ast else (None, None)):
        return False
    if writer_state(header) == "running":
        return False  # still being written: any conversion is a snapshot
    return (src.get("raw_size") == st.st_size and src.get("state") == header["state"]
            and src.get("n_chunks") == header["n_chunks"]
            and src.get("raw_mtime_ns") == st.st_mtime_ns)


# The column kinds of the two parquet schemas (the row schema and the
# summary-mode aggregates), checked on every file read: a dataset written or
# edited by another tool is refused with the column's name (CorruptError)
# instead of failing later in an analysis.  tests/test_dataset.py checks these
# against the frames raw_to_frame and agg_to_frame build.
ROW_KINDS: dict[str, str] = {
    c: "str" if c in CATEGORY_COLUMNS else "bool" if c in ("in_place", "device") else "int"
    for c in COLUMNS}
AGG_KINDS: dict[str, str] = {
    c: ("str" if c in CATEGORY_COLUMNS else "float" if c == "ns_per_tick"
        else "list" if c == "hist" else "int") for c in AGG_COLUMNS}
ROW_REQUIRED = ("rank", "op", "t_start_ns", "dur_ns", "bytes")
AGG_REQUIRED = ("rank", "op", "bytes", "calls", "total_ns")


def _is_str(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _kind_ok(t: pa.DataType, kind: str) -> bool:
    if kind == "str":
        return _is_str(t)
    if kind == "bool":
        return bool(pa.types.is_boolean(t) or pa.types.is_integer(t))
    if kind == "float":
        return bool(pa.types.is_floating(t) or pa.types.is_integer(t))
    if kind == "list":
        return bool((pa.types.is_list(t) or pa.types.is_large_list(t))
                    and pa.types.is_integer(t.value_type))
    return bool(pa.types.is_integer(t))


def _plain(t: pa.DataType) -> bool:
    """A column type every reader converts (other tools' extra columns)."""
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t)
                or pa.types.is_boolean(t) or _is_str(t))


def schema_columns(schema: pa.Schema, aggregates: bool = False) -> list[str]:
    """The columns of a parquet schema to read: those of the row (or aggregate)
    schema, each of the expected kind, plus other tools' extra columns of plain
    types (others are skipped).  Raises CorruptError (path None) naming the first
    column of the wrong kind, or a required column that is absent."""
    kinds = AGG_KINDS if aggregates else ROW_KINDS
    required = AGG_REQUIRED if aggregates else ROW_REQUIRED
    names = list(schema.names)
    if len(set(names)) != len(names):
        raise CorruptError(None, "a column name appears twice in the parquet schema")
    missing = [c for c in required if c not in names]
    if missing:
        raise CorruptError(None, f"not a horovod-profiler dataset: no {missing[0]} column")
    out = []
    for field in schema:
        kind = kinds.get(field.name)
        if kind is not None:
            if not _kind_ok(field.type, kind):
                raise CorruptError(None, f"column {printable(field.name)} has type "
                                         f"{field.type}, expected {kind}")
            out.append(field.name)
        elif _plain(field.type):
            out.append(field.name)
    return out


def read_dataset(files: Iterable[str | os.PathLike[str]], *,
                 ranks: Iterable[int] | None = None,
                 columns: Sequence[str] | None = None,
                 filter: Any = None, aggregates: bool = False) -> pd.DataFrame:
    """Parquet files of the row schema (or, aggregates=True, of the summary-mode
    aggregates) -> one DataFrame, the rank filter and any other pyarrow.dataset
    `filter` expression (a callable of the column names -> expression, or None)
    pushed down to the scan.  Every way a file can be bad ends in CorruptError
    or NotFoundError."""
    paths = [str(p) for p in files]
    for p in paths:
        if not os.path.isfile(p):
            raise NotFoundError(p, "dataset file missing")
    if not paths:
        return empty_frame(columns)
    where = paths[0] if len(paths) == 1 else os.path.dirname(paths[0])
    try:
        dataset = pads.dataset(paths, format="parquet")
        try:
            usable = schema_columns(dataset.schema, aggregates)
        except CorruptError as exc:
            raise CorruptError(where, exc.message) from None
        cols = (usable if columns is None
                else [c for c in dict.fromkeys(columns) if c in usable])
        flt = filter(set(usable)) if callable(filter) else filter
        if ranks is not None:
            by_rank = pads.field("rank").isin([int(r) for r in ranks])
            flt = by_rank if flt is None else by_rank & flt
        table = dataset.to_table(columns=cols, filter=flt)
        # to_pandas reads the pandas metadata stored in the file (JSON): a
        # corrupt one fails there with ValueError / KeyError / TypeError.
        return table_to_frame(table)
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError,
            OverflowError) as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise CorruptError(where, f"unreadable parquet dataset: {printable(text)}") from None


def printable_columns(df: pd.DataFrame, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """`df` with the control characters of its names spelled \\xNN (profiler.errors.
    printable), in place: the given columns, else every column that is not
    numeric or boolean.  Categorical columns are fixed through their categories
    (a handful of names, whatever the number of rows); the others value by value."""
    chosen = list(df.columns) if columns is None else [c for c in columns if c in df.columns]
    for c in chosen:
        col = df[c]
        if isinstance(col.dtype, pd.CategoricalDtype):
            cats = [str(x) for x in col.cat.categories]
            safe = [printable(x) for x in cats]
            if safe == cats:
                continue
            if len(set(safe)) == len(safe):
                df[c] = col.cat.rename_categories(safe)
            else:  # two names that differ only by the escaping: merge them
                df[c] = col.astype(str).map(printable).astype("category")
        elif not (pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col)):
            df[c] = col.map(lambda v: printable(v) if isinstance(v, str) else v)
    return df


def table_to_frame(table: pa.Table) -> pd.DataFrame:
    # Categories for every string dictionary, even across files with different
    # dictionaries (to_pandas unifies them).  Names written by another tool may
    # hold control characters: spelled \xNN like the converter does, so that
    # no reader ever passes an escape sequence on to a terminal or a page.
    df = table.to_pandas()
    for c in CATEGORY_COLUMNS:
        if c in df.columns and not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype("category")
    return printable_columns(df, CATEGORY_COLUMNS)


def empty_frame(columns: Sequence[str] | None = None) -> pd.DataFrame:
    """An empty DataFrame with the row schema's dtypes."""
    w = RawFile(path=Path("."), header={"rank": 0, "clock_kind": 2, "offset_ns": 0,
                                         "job_t0_ns": 0}, comms=np.zeros(0, F.COMM_ENTRY_DTYPE),
                tracks=np.zeros(0, F.TRACK_ENTRY_DTYPE), records=np.zeros(0, F.RECORD_DTYPE))
    df = raw_to_frame(w)
    return df if columns is None else df[[c for c in dict.fromkeys(columns) if c in df.columns]]
