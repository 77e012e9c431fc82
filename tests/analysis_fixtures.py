"""Synthetic DataFrames that follow the row schema of docs/ARCHITECTURE.md section 3.

The analysis tests build their inputs here from known parameters (latency alpha,
bandwidth, spikes, step structure), so every expected number is derived from the
construction rather than measured.  `frame()` is the single place that turns a
dict of columns into a schema-conformant DataFrame (exact dtypes, all columns).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

# column -> dtype of docs/ARCHITECTURE.md section 3
SCHEMA: dict[str, str] = {
    "rank": "int32",
    "backend": "category",
    "op": "category",
    "t_start_ns": "int64",
    "t_end_ns": "int64",
    "dur_ns": "int64",
    "bytes": "int64",
    "count": "int64",
    "dtype": "category",
    "dtype_size": "int32",
    "redop": "category",
    "flags": "int32",
    "in_place": "bool",
    "device": "bool",
    "rc": "int16",
    "comm": "uint64",
    "comm_size": "int32",
    "comm_rank": "int32",
    "comm_name": "category",
    "root": "int32",
    "seq": "int64",
    "track": "int32",
    "tid": "int32",
    "thread_kind": "category",
    "thread_name": "category",
    "group": "int32",
    "kind": "category",
    "step": "int32",
}

WORLD = 0x5EED


def frame(rows: dict[str, Sequence[Any] | np.ndarray], label: str | None = None) -> pd.DataFrame:
    """Columns (t_start_ns, t_end_ns, rank, op, bytes at least) -> full schema frame."""
    n = len(rows["t_start_ns"])
    t0 = np.asarray(rows["t_start_ns"], dtype=np.int64)
    t1 = np.asarray(rows["t_end_ns"], dtype=np.int64)
    nbytes = np.asarray(rows["bytes"], dtype=np.int64)
    op = np.asarray(rows["op"], dtype=object)
    is_app = np.isin(op, ["step", "mark"])
    dsize = np.asarray(rows.get("dtype_size", np.where(is_app, 0, 4)), dtype=np.int32)
    defaults: dict[str, Any] = {
        "backend": np.where(is_app, "app", "mpi"),
        "dur_ns": t1 - t0,
        "count": np.where(dsize > 0, nbytes // np.maximum(dsize, 1), 0),
        "dtype": np.where(is_app, "unknown", "MPI_FLOAT"),
        "dtype_size": dsize,
        "redop": np.where(is_app | (op != "allreduce"), "none", "sum"),
        "flags": 0,
        "in_place": False,
        "device": False,
        "rc": 0,
        "comm": np.where(is_app, 0, WORLD),
        "comm_size": 2,
        "comm_rank": rows["rank"],
        "comm_name": np.where(is_app, "", "MPI_COMM_WORLD"),
        "root": -1,
        "seq": -1,
        "track": 0,
        "tid": 1000,
        "thread_kind": "main",
        "thread_name": "python",
        "group": 0,
        "kind": np.where(is_app, "app", "data"),
        "step": -1,
    }
    data: dict[str, Any] = {}
    for col, dtype in SCHEMA.items():
        value = rows.get(col, defaults.get(col))
        arr = np.broadcast_to(np.asarray(value), (n,)) if np.ndim(value) == 0 else value
        data[col] = pd.Series(np.asarray(arr), dtype=dtype if dtype != "category" else object)
    df = pd.DataFrame(data)
    for col, dtype in SCHEMA.items():
        if dtype == "category":
            df[col] = df[col].astype(str).astype("category")
        else:
            df[col] = df[col].astype(dtype)
    for col, value in rows.items():
        if col not in SCHEMA:
            df[col] = value
    if label is not None:
        df["label"] = pd.Categorical([label] * n)
    return df


def concat(*frames: pd.DataFrame) -> pd.DataFrame:
    """Concatenate labelled frames, keeping categorical columns categorical."""
    out = pd.concat(frames, ignore_index=True)
    for col, dtype in SCHEMA.items():
        if dtype == "category" or col == "label":
            out[col] = out[col].astype(str).astype("category")
    if "label" in out:
        out["label"] = out["label"].astype(str).astype("category")
    return out


def alpha_beta_ns(nbytes: np.ndarray | float, alpha_us: float, bw_gbps: float) -> np.ndarray:
    """Latency in ns of the alpha-beta model: alpha + bytes / bandwidth (1 GB/s = 1 B/ns)."""
    return alpha_us * 1e3 + np.asarray(nbytes, dtype=float) / bw_gbps


def sweep(
    sizes: Iterable[int],
    *,
    alpha_us: float = 2.0,
    bw_gbps: float = 5.0,
    regions: Sequence[tuple[int, float, float]] = (),
    iters: int = 20,
    ranks: int = 2,
    noise: float = 0.0,
    spikes: dict[int, float] | None = None,
    op: str = "allreduce",
    label: str | None = None,
    seed: int = 0,
    gap_ns: int = 1000,
) -> pd.DataFrame:
    """A benchmark-like trace: `iters` calls of each size on every rank.

    Latency follows alpha + bytes/bw; `regions` = [(from_bytes, alpha_us, bw_gbps), ...]
    switches parameters at a size (a protocol knee).  `spikes` multiplies the latency
    of given sizes.  `noise` is the sigma of a multiplicative log-normal jitter.
    Calls are matched across ranks by (comm, seq) with identical times.
    """
    rng = np.random.default_rng(seed)
    sizes = list(sizes)
    spikes = spikes or {}
    cols: dict[str, list[Any]] = {k: [] for k in ("t_start_ns", "t_end_ns", "rank", "op",
                                                  "bytes", "seq")}
    t = 0
    seq = 0
    for size in sizes:
        a, bw = alpha_us, bw_gbps
        for start, ra, rbw in regions:
            if size >= start:
                a, bw = ra, rbw
        base = float(alpha_beta_ns(size, a, bw)) * spikes.get(size, 1.0)
        for _ in range(iters):
            lat = base * (float(np.exp(rng.normal(0.0, noise))) if noise > 0 else 1.0)
            d = max(1, int(round(lat)))
            for r in range(ranks):
                cols["t_start_ns"].append(t)
                cols["t_end_ns"].append(t + d)
                cols["rank"].append(r)
                cols["op"].append(op)
                cols["bytes"].append(size)
                cols["seq"].append(seq)
            seq += 1
            t += d + gap_ns
    return frame({**cols, "comm_size": ranks}, label=label)


def training(
    *,
    steps: int = 12,
    ranks: int = 2,
    step_ns: int = 10_000_000,
    images: int = 32,
    sizes: Sequence[int] = (4096, 1 << 20),
    call_ns: Sequence[int] = (200_000, 1_000_000),
    tail_ns: int = 500_000,
    control_per_step: int = 5,
    late_rank: int | None = None,
    late_ns: int = 0,
    label: str | None = None,
    step_jitter_ns: Sequence[int] | None = None,
    extra_comm_ns: Sequence[int] | None = None,
    sync: bool = False,
) -> pd.DataFrame:
    """A Horovod-like training trace with a known step structure.

    Each step s (on every rank) spans [s*step_ns, (s+1)*step_ns + jitter[s]).  Inside it,
    rank r's background thread (track 1, thread_kind horovod) makes `control_per_step`
    8-byte control allreduces at the start, then one data allreduce per entry of
    `sizes` (durations `call_ns`, plus extra_comm_ns[s] added to the last one),
    back to back, ending `tail_ns` before the step end; the first data call
    starts after a gap so the data burst is the exposed tail.  An APP_STEP row
    (op "step", count = images) spans the step on the main thread.
    `late_rank` arrives `late_ns` later at every data call (a straggler): the others
    start on time and wait; everyone leaves at the same time.
    `sync`: each rank's main thread also records the time it waited in
    synchronize (op "sync"): from its arrival (the first data call's start, the
    late rank late_ns after the others) to tail_ns / 2 before the step's end.
    """
    jitter = list(step_jitter_ns) if step_jitter_ns is not None else [0] * steps
    extra = list(extra_comm_ns) if extra_comm_ns is not None else [0] * steps
    cols: dict[str, list[Any]] = {
        k: [] for k in ("t_start_ns", "t_end_ns", "rank", "op", "bytes", "seq", "kind",
                        "track", "thread_kind", "tid", "step", "count", "backend",
                        "dtype_size", "redop", "dtype", "comm", "thread_name")
    }

    def add(**kw: Any) -> None:
        for k in cols:
            cols[k].append(kw[k])

    seq = 0
    begin = 0
    for s in range(steps):
        end = begin + step_ns + jitter[s]
        durs = list(call_ns)
        durs[-1] += extra[s]
        burst = sum(durs) + late_ns * len(durs)
        data_start = end - tail_ns - burst
        for r in range(ranks):
            add(t_start_ns=begin, t_end_ns=end, rank=r, op="step", bytes=0, seq=s, kind="app",
                track=0, thread_kind="main", tid=100 + r, step=s, count=images, backend="app",
                dtype_size=0, redop="none", dtype="unknown", comm=0, thread_name="python")
        cseq = seq
        for c in range(control_per_step):
            t0 = begin + 10_000 + c * 20_000
            for r in range(ranks):
                add(t_start_ns=t0, t_end_ns=t0 + 5_000, rank=r, op="allreduce", bytes=8,
                    seq=cseq, kind="control", track=1, thread_kind="horovod", tid=200 + r,
                    step=s, count=1, backend="mpi", dtype_size=8, redop="band",
                    dtype="MPI_LONG_LONG_INT", comm=WORLD, thread_name="python")
            cseq += 1
        if sync:
            for r in range(ranks):
                late = late_ns if (late_rank is not None and r == late_rank) else 0
                add(t_start_ns=data_start + late, t_end_ns=end - tail_ns // 2, rank=r,
                    op="sync", bytes=0, seq=s, kind="app", track=0, thread_kind="main",
                    tid=100 + r, step=s, count=0, backend="app", dtype_size=0, redop="none",
                    dtype="unknown", comm=0, thread_name="python")
        t = data_start
        for size, d in zip(sizes, durs):
            for r in range(ranks):
                late = late_ns if (late_rank is not None and r == late_rank) else 0
                add(t_start_ns=t + late, t_end_ns=t + d + late_ns, rank=r,
                    op="allreduce", bytes=size, seq=cseq, kind="data", track=1,
                    thread_kind="horovod", tid=200 + r, step=s, count=size // 4,
                    backend="mpi", dtype_size=4, redop="sum", dtype="MPI_FLOAT", comm=WORLD,
                    thread_name="python")
            cseq += 1
            t += d + late_ns
        seq = cseq
        begin = end
    df = frame({**cols, "comm_size": ranks}, label=label)
    return df
