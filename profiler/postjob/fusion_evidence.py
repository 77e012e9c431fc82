"""Fusion inference's evidence (profiler.postjob.fusion has the method): the
families of collectives Horovod fuses, the tensors and calls each rank's
records give, Horovod's cycles, and one family's evidence as arrays."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats import record as F
from profiler.postjob.classify import classify, is_horovod_row

#: Ranks whose records are read as evidence (rank 0 and the next ones).
MAX_RANKS = 8
#: The per-rank columns the inference reads (the rest of a rank's dataset is
#: not loaded for the other ranks' evidence); the last three are computed
#: (cycles) and kept by `evidence`.
EVIDENCE_COLUMNS = ("op", "backend", "kind", "seq", "comm", "track", "thread_kind",
                    "t_start_ns", "t_end_ns", "bytes", "dtype", "redop", "root", "buf", "rc",
                    "cyc_seq", "cyc_start_ns", "cyc_floor_ns")

@dataclass(frozen=True)
class Family:
    key: str
    record_ops: tuple[str, ...]
    horovod_op: str      # the timeline's op name
    activity: str        # the timeline's collective activity
    fused: bool          # Horovod may fuse several tensors into one call
    gathered: bool = False  # call bytes = every rank's contribution


# NCCL's allreduce and broadcast carry the same bytes as MPI's (count x size of
# the buffer), and Horovod's GPU ops call them from its background thread as it
# calls MPI on CPU.  NCCL records keep no receive buffer (their aux is the
# group number), so the calls of a GPU job are matched by bytes and order,
# with the confidence that gives.  NCCL's allgather and reduce-scatter count
# bytes per rank, not as the gathered families here do: not matched.
# Gloo's records (hooks/gloo.c) count bytes as MPI's do and keep the buffer
# folded as MPI's keep the receive buffer: matched the same way.
_AR = Family("allreduce", ("allreduce", "nccl_allreduce", "gloo_allreduce"), "ALLREDUCE",
             "MPI_ALLREDUCE", True)
_AG = Family("allgather", ("allgatherv", "gloo_allgather"), "ALLGATHER", "MPI_ALLGATHER", True,
             True)
_RS = Family("reducescatter", ("reduce_scatter", "reduce_scatter_block", "gloo_reducescatter"),
             "REDUCESCATTER", "MPI_REDUCESCATTER", True)
#: Adasum (op=hvd.Adasum; the tensor record's reduction "user"): on Horovod's
#: MPI CPU path (ops/adasum_mpi_operations.cc, adasum/adasum.h) a fused
#: response's data goes by MPI_Sendrecv (point to point: half the buffer
#: each way at 2 ranks, recursively at more), and each level of the
#: reduction makes one MPI_Allreduce of 3 MPI_DOUBLE per tensor (its dot
#: product and two norms).  That allreduce is the call the lineage names:
#: 24 bytes a tensor, whatever its size.
ADASUM = Family("adasum", ("allreduce",), "ADASUM", "MPI_ALLREDUCE", True)
ADASUM_BYTES_PER_TENSOR = 24
#: tensor name prefix (Horovod's GetOpName) -> family
FAMILIES: dict[str, Family] = {
    "allreduce": _AR, "grouped_allreduce": _AR,
    "allgather": _AG, "grouped_allgather": _AG,
    "reducescatter": _RS, "grouped_reducescatter": _RS,
    "broadcast": Family("broadcast", ("bcast", "nccl_broadcast", "nccl_bcast", "gloo_broadcast"),
                        "BROADCAST", "MPI_BCAST", False),
    "alltoall": Family("alltoall", ("alltoallv", "alltoall", "gloo_alltoall"), "ALLTOALL",
                       "MPI_ALLTOALL", False),
}

#: hvprof dtype name of a tensor (NCCL codes) -> the torch name shown
_DTYPE_SHOWN = {"ncclInt8": "int8", "ncclUint8": "uint8", "ncclInt32": "int32",
                "ncclInt64": "int64", "ncclFloat16": "float16", "ncclFloat32": "float32",
                "ncclFloat64": "float64", "ncclBfloat16": "bfloat16"}
#: a call's datatype -> the tensor dtypes it can carry (mpi_context.cc
#: GetMPIDataType; float16 and bfloat16 go as a derived type with a user op);
#: a datatype not listed can carry any
_CALL_DTYPES: dict[str, tuple[str, ...]] = {
    "MPI_FLOAT": ("ncclFloat32",), "MPI_DOUBLE": ("ncclFloat64",),
    "MPI_INT32_T": ("ncclInt32",), "MPI_INT64_T": ("ncclInt64",),
    "MPI_INT8_T": ("ncclInt8",), "MPI_UINT8_T": ("ncclUint8",), "MPI_C_BOOL": ("ncclUint8",),
    "derived": ("ncclFloat16", "ncclBfloat16"),
    "ncclFloat32": ("ncclFloat32",), "ncclFloat64": ("ncclFloat64",),
    "ncclFloat16": ("ncclFloat16",), "ncclBfloat16": ("ncclBfloat16",),
    "ncclInt32": ("ncclInt32",), "ncclInt64": ("ncclInt64",), "ncclInt8": ("ncclInt8",),
    "ncclUint8": ("ncclUint8",),
}


# --------------------------------------------------------------------------
# evidence
# --------------------------------------------------------------------------

def _prefixes(name: np.ndarray, sel: pd.DataFrame) -> list[str]:
    """Each tensor's operation: its name's prefix (horovod.torch's names), else
    the one its record states (TensorFlow's node names: flags bits 12-15)."""
    ops = ((sel["flags"].to_numpy(dtype=np.int64) >> F.TENSOR_OP_SHIFT) & 15
           if "flags" in sel.columns else np.zeros(len(sel), dtype=np.int64))
    out = []
    for s, op in zip(name.tolist(), ops.tolist()):
        p = s.split(".", 1)[0]
        out.append(F.TENSOR_OPS.get(op, p) if op and p not in FAMILIES else p)
    return out


def _tensor_rows(frame: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """The APP_TENSOR rows of one rank with name, prefix and occurrence."""
    cols = ["name", "prefix", "occurrence", "t_start_ns", "t_end_ns", "bytes", "dtype", "buf",
            "root", "ps", "redop"]
    sel = frame.loc[(frame["op"] == "tensor").to_numpy(dtype=bool)]
    if sel.empty:
        return pd.DataFrame(columns=cols)
    ids = sel["seq"].to_numpy(dtype=np.int64)
    known = (ids >= 0) & (ids < len(names))
    sel = sel.loc[known]
    ids = ids[known]
    name = np.asarray([names[i] for i in ids.tolist()], dtype=object)
    t0 = sel["t_start_ns"].to_numpy(dtype=np.int64)
    out = pd.DataFrame({
        "name": name,
        "prefix": _prefixes(name, sel),
        "t_start_ns": t0,
        "t_end_ns": (sel["t_end_ns"].to_numpy(dtype=np.int64) if "t_end_ns" in sel.columns
                     else t0),
        "bytes": sel["bytes"].to_numpy(dtype=np.int64),
        "dtype": sel["dtype"].astype(str).to_numpy(),
        "buf": (sel["buf"].to_numpy(dtype=np.int64) if "buf" in sel.columns
                else np.zeros(len(sel), dtype=np.int64)),
        "root": sel["root"].to_numpy(dtype=np.int64),
        # the process set id rides in the record's rc (hooks/core.c hvprof_record_tensor)
        "ps": (sel["rc"].to_numpy(dtype=np.int64) if "rc" in sel.columns
               else np.zeros(len(sel), dtype=np.int64)),
        "redop": _str(sel, "redop"),
    }).sort_values("t_start_ns", kind="stable").reset_index(drop=True)
    out["occurrence"] = out.groupby("name", sort=False).cumcount().astype(np.int64)
    return out[cols]


def _str(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame.columns:
        return np.full(len(frame), "", dtype=object)
    col = frame[name]
    return np.asarray(col.astype(object).where(col.notna(), ""), dtype=object).astype(str)


def _eq(frame: pd.DataFrame, name: str, value: str) -> np.ndarray:
    """frame[name] == value as a bool array (categoricals compared by code)."""
    if name not in frame.columns:
        return np.zeros(len(frame), dtype=bool)
    return (frame[name] == value).to_numpy(dtype=bool, na_value=False)


def cycles(frame: pd.DataFrame, horovod: np.ndarray | None = None,
           keep: np.ndarray | None = None) -> pd.DataFrame:
    """The rows of Horovod's thread(s) (mask `horovod`, else is_horovod_row;
    of those only the `keep` ones, default all) in start order per thread,
    each with the cycle it belongs to (per communicator, point 3 of the
    module's notes): ``cyc_seq`` (the seq of the call that opened the cycle,
    the same on every rank; -1 before the first), ``cyc_start_ns`` (that
    call's start: the cycle's queue was popped before) and ``cyc_floor_ns``
    (the end of the thread's call just before it: the queue was popped
    after).  A cycle opens with the response cache's MPI_BAND bit-vector
    allreduce, or with the negotiation's MPI_Gather of MPI_INT to root 0
    when no bit-vector call came just before it on that communicator (the
    cache off).  Vectorised over every Horovod row (a long job makes about
    1,000 control calls a second per rank); only the kept rows are copied."""
    mask = np.asarray(is_horovod_row(frame) if horovod is None else horovod, dtype=bool)
    idx = np.flatnonzero(mask)
    cols = {"cyc_seq": -1, "cyc_start_ns": math.nan, "cyc_floor_ns": math.nan}
    if len(idx) == 0:
        out = frame.iloc[0:0].copy()
        for c, v in cols.items():
            out[c] = np.full(0, v)
        return out
    ts = frame["t_start_ns"].to_numpy(dtype=np.int64)[idx]
    track = frame["track"].to_numpy(dtype=np.int64)[idx] if "track" in frame.columns \
        else np.zeros(len(idx), dtype=np.int64)
    order = np.lexsort((ts, track))
    idx, ts, track = idx[order], ts[order], track[order]
    te = (frame["t_end_ns"].to_numpy(dtype=np.float64)[idx] if "t_end_ns" in frame.columns
          else ts.astype(np.float64))
    allreduce = _eq(frame, "op", "allreduce")[idx]
    band = allreduce & _eq(frame, "redop", "band")[idx]
    bitv = band | (allreduce & _eq(frame, "redop", "bor")[idx])
    root = frame["root"].to_numpy(dtype=np.int64)[idx] if "root" in frame.columns \
        else np.full(len(idx), -1, dtype=np.int64)
    gather = _eq(frame, "op", "gather")[idx] & _eq(frame, "dtype", "MPI_INT")[idx] & (root == 0)
    comm = frame["comm"].to_numpy()[idx] if "comm" in frame.columns \
        else np.zeros(len(idx), dtype=np.int64)
    comm_code = pd.factorize(comm)[0].astype(np.int64)
    group = track * (int(comm_code.max()) + 1) + comm_code
    # within each (thread, communicator), in start order: the call before
    by_g = np.lexsort((ts, group))
    g_sorted = group[by_g]
    first = np.ones(len(by_g), dtype=bool)
    first[1:] = g_sorted[1:] != g_sorted[:-1]
    prev_bitv = np.zeros(len(idx), dtype=bool)
    prev_bitv[by_g[1:]] = bitv[by_g[:-1]] & ~first[1:]
    opens = band | (gather & ~prev_bitv)
    # the latest opening call at or before each row, within its group
    pos = np.arange(len(idx))
    cand = np.where(opens[by_g], pos[by_g], -1)
    seg = np.cumsum(first) - 1
    at_sorted = _grouped_cummax(cand, seg)
    at = np.empty(len(idx), dtype=np.int64)
    at[by_g] = at_sorted
    prev_end = np.empty(len(idx), dtype=np.float64)
    prev_end[0] = math.nan
    prev_end[1:] = te[:-1]
    prev_end[1:][track[1:] != track[:-1]] = math.nan
    sel = np.ones(len(idx), dtype=bool) if keep is None else np.asarray(keep, dtype=bool)[idx]
    k_at = at[sel]
    ok = k_at >= 0
    safe = np.where(ok, k_at, 0)
    seq = frame["seq"].to_numpy(dtype=np.int64)[idx]
    out = frame.iloc[idx[sel]].copy()
    out["cyc_seq"] = np.where(ok, seq[safe], -1)
    out["cyc_start_ns"] = np.where(ok, ts[safe].astype(np.float64), math.nan)
    out["cyc_floor_ns"] = np.where(ok, prev_end[safe], math.nan)
    return out


def _grouped_cummax(values: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Running maximum of `values` restarting at each segment (seg: the
    segment number of each position, non-decreasing); values >= -1."""
    # shift each segment above all earlier ones, accumulate, shift back
    span = int(values.max(initial=-1)) + 2
    lifted = values + 1 + seg * span
    return np.maximum.accumulate(lifted) - 1 - seg * span


def _is_data(frame: pd.DataFrame) -> np.ndarray:
    """kind == "data" (classified here when the frame has no kind)."""
    if "kind" in frame.columns:
        return _eq(frame, "kind", "data")
    return np.asarray(classify(frame).astype(str)) == "data"


def _data_calls(frame: pd.DataFrame) -> pd.DataFrame:
    """One rank's data calls made by Horovod's thread, in start order, with
    their cycle (cycles)."""
    if len(frame) == 0:
        return frame
    if "cyc_seq" in frame.columns:  # an evidence frame: cycles already known
        kind = frame["kind"].astype(str).to_numpy()
        mask = (kind == "data") & (_str(frame, "thread_kind") == "horovod")
        out = frame.loc[mask]
    else:
        data = _is_data(frame)
        hv = is_horovod_row(frame)
        out = cycles(frame, hv, keep=data & hv)
    return out.sort_values("t_start_ns", kind="stable").reset_index(drop=True)


def evidence(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of one rank's frame that `infer` reads: its tensor records
    and the data calls of Horovod's thread with their cycle (cycles), in
    EVIDENCE_COLUMNS.  Which thread is Horovod's is decided on the whole
    frame (it may take the control rows' signature), and the cycles on all
    of its calls, so the kept calls are marked thread_kind "horovod" and
    carry their cycle: the reduced frame gives `infer` the same answer."""
    cols = [c for c in EVIDENCE_COLUMNS if c in frame.columns]
    if len(frame) == 0:
        return frame.loc[:, cols]
    hv = is_horovod_row(frame)
    calls = cycles(frame, hv, keep=_is_data(frame) & hv)
    calls["kind"] = "data"
    calls["thread_kind"] = "horovod"
    tens = frame.loc[(frame["op"] == "tensor").to_numpy(dtype=bool)].copy()
    tens["kind"] = "app"
    for col, v in (("cyc_seq", -1), ("cyc_start_ns", math.nan), ("cyc_floor_ns", math.nan)):
        tens[col] = v
    keep = [x for x in EVIDENCE_COLUMNS if x in calls.columns or x in tens.columns]
    out = pd.concat([tens.reindex(columns=keep), calls.reindex(columns=keep)],
                    ignore_index=True)
    if "thread_kind" in out.columns:
        out["thread_kind"] = out["thread_kind"].astype(object).where(
            out["thread_kind"].notna(), "other").astype(str)
    return out.sort_values("t_start_ns", kind="stable").reset_index(drop=True)


@dataclass
class _Call:
    k: int
    tensors: list[int] = field(default_factory=list)   # sub ids
    certain: bool = True
    confidence: float = 1.0
    candidates: list[int] = field(default_factory=list)  # ambiguous: every possible tensor
    method: str = ""
    ways_log10: float = 0.0      # log10 of the sets that fit (0: one)
    ways_bound: bool = False     # the count is a lower bound (the search was cut)
    broken: bool = False         # a tensor it held was taken back with none to swap in


def _ambiguous(call: _Call, log10: float, bound: bool, candidates: Sequence[int]) -> None:
    call.certain = False
    call.ways_log10 = max(call.ways_log10, log10)
    call.ways_bound = call.ways_bound or bound
    call.confidence = 0.0 if call.ways_bound else 10.0 ** -call.ways_log10
    call.candidates = sorted(set(call.candidates) | {int(x) for x in candidates})


# --------------------------------------------------------------------------
# one family's evidence
# --------------------------------------------------------------------------

@dataclass
class _Evidence:
    """One family's tensors and calls over the ranks read (rank 0's view)."""

    subs: pd.DataFrame
    calls: pd.DataFrame
    sub_t: np.ndarray      # (tensors, ranks) enqueue start, NaN = not on that rank
    sub_te: np.ndarray     # (tensors, ranks) enqueue end
    weights: np.ndarray    # bytes a call counts for each tensor
    call_t: np.ndarray     # (calls, ranks) call start
    upper: np.ndarray      # (calls, ranks) the cycle's upper bound (its start; else the call's)
    floor: np.ndarray      # (calls, ranks) the cycle's lower bound (NaN: unknown)
    cycle: list[Any]       # per call: its cycle's key on rank 0 (unique when unknown)
    all_ranks: bool        # every rank of the job read (the lower bound holds)
    world: int = 0         # the job's ranks



def _families(subs: pd.DataFrame) -> list[Family | None]:
    """Each tensor's family: its name's prefix, Adasum by its reduction."""
    red = subs["redop"].astype(str).to_numpy() if "redop" in subs.columns else \
        np.full(len(subs), "")
    return [ADASUM if f is _AR and r == "user" else f
            for f, r in zip((FAMILIES.get(p) for p in subs["prefix"].tolist()), red)]


def _family_evidence(fam: Family, subs: pd.DataFrame, calls: pd.DataFrame,
                     subs_by_rank: Mapping[int, pd.DataFrame],
                     calls_by_rank: Mapping[int, pd.DataFrame], ranks: Sequence[int],
                     world: int, all_ranks: bool) -> _Evidence:
    # columns as lists first: iterating an Arrow-backed Series builds each
    # element's Python object one call at a time
    key = list(zip(subs["name"].tolist(), subs["occurrence"].tolist()))
    n, m, nr = len(subs), len(calls), len(ranks)
    sub_t = np.full((n, nr), np.nan)
    sub_te = np.full((n, nr), np.nan)
    sub_bytes_all = np.zeros(n, dtype=np.int64)
    sub_seen = np.zeros(n, dtype=np.int64)
    call_t = np.full((m, nr), np.nan)
    upper = np.full((m, nr), np.nan)
    floor = np.full((m, nr), np.nan)
    ckey = list(zip(calls["comm"].to_numpy().tolist(), calls["seq"].to_numpy().tolist()))
    for j, r in enumerate(ranks):
        sr = subs_by_rank[r]
        idx = dict(zip(zip(sr["name"].tolist(), sr["occurrence"].tolist()), range(len(sr))))
        pos = np.asarray([idx.get(kk, -1) for kk in key], dtype=np.int64)
        got = pos >= 0
        sub_t[got, j] = sr["t_start_ns"].to_numpy(dtype=np.float64)[pos[got]]
        sub_te[got, j] = sr["t_end_ns"].to_numpy(dtype=np.float64)[pos[got]]
        sub_bytes_all[got] += sr["bytes"].to_numpy(dtype=np.int64)[pos[got]]
        sub_seen[got] += 1
        cr = calls_by_rank[r]
        if len(cr):
            cidx = dict(zip(zip(cr["comm"].to_numpy().tolist(),
                                cr["seq"].to_numpy().tolist()), range(len(cr))))
            cpos = np.asarray([cidx.get(kk, -1) for kk in ckey], dtype=np.int64)
            cg = cpos >= 0
            call_t[cg, j] = cr["t_start_ns"].to_numpy(dtype=np.float64)[cpos[cg]]
            if "cyc_start_ns" in cr.columns:
                upper[cg, j] = cr["cyc_start_ns"].to_numpy(dtype=np.float64)[cpos[cg]]
                floor[cg, j] = cr["cyc_floor_ns"].to_numpy(dtype=np.float64)[cpos[cg]]
    upper = np.where(np.isfinite(upper), upper, call_t)
    if m and "cyc_seq" in calls.columns:
        cs = calls["cyc_seq"].to_numpy(dtype=np.int64)
        cycle: list[Any] = [(c, int(s)) if s >= 0 else ("call", k) for k, (c, s) in
                            enumerate(zip(calls["comm"].to_numpy().tolist(), cs.tolist()))]
    else:
        cycle = [("call", k) for k in range(m)]
    weights = subs["bytes"].to_numpy(dtype=np.int64).copy()
    if fam is ADASUM:
        weights = np.full(n, ADASUM_BYTES_PER_TENSOR, dtype=np.int64)
    if fam.gathered:
        every = sub_seen == world
        weights = np.where(every, sub_bytes_all, weights * world)
    return _Evidence(subs, calls, sub_t, sub_te, weights, call_t, upper, floor, cycle,
                     all_ranks, world)


