"""Fusion lineage from the profiler's own records: which tensors rode in each
collective Horovod made, without Horovod's timeline.

Evidence (all recorded at the cost of one record per call or tensor):

* APP_TENSOR rows (op "tensor", profiler.collect.tensors): each tensor handed
  to Horovod on each rank, with its name, bytes, dtype, enqueue time (the
  record's start and end bracket Horovod's enqueue) and the address of its
  output folded to 32 bits (column ``buf``);
* the calls of Horovod's background thread on every rank read: the data
  calls with their bytes and the receive buffer, folded the same way
  (``buf``), and the control calls that open each of its cycles.

What Horovod guarantees (horovod/common/operations.cc RunLoopOnce,
controller.cc ComputeResponseList and FuseResponses, response_cache.cc,
tensor_queue.cc, ops/mpi_operations.cc, at v0.28.1):

1. A call that carries one tensor works in that tensor's output memory: its
   receive buffer is the output's address (MPI_Allreduce, MPI_Bcast).  A call
   that carries several works in the fusion buffer, never in a tensor's.
2. A fused call carries tensors of one dtype, each exactly once; its element
   count is the sum of theirs (allreduce, reducescatter: bytes equal the sum of
   the tensors' bytes; allgather: of every rank's contributions).
   Broadcasts and alltoalls are never fused.
3. Cycles.  Each pass of the background loop sleeps out the cycle time, then,
   per process set, pops every request queued so far (ComputeResponseList:
   PopMessagesFromQueue comes first), makes its first MPI call (the response
   cache's bit-vector MPI_Allreduce with MPI_BAND, or, with the cache off,
   the negotiation's MPI_Gather of 1 MPI_INT to root 0) and then performs
   the cycle's responses.  So a tensor rode in cycle c only if it was
   enqueued on every rank before that rank's first call of cycle c (the
   *upper bound*); and a tensor enqueued on every rank before the end of the
   call that rank made just before cycle c (before the pop) was popped by
   cycle c on every rank, so it rode in cycle c at the latest (the *lower
   bound*: every cached tensor held by all ranks is a common cache hit, every
   uncached one has all its requests counted).
4. A name is in Horovod's queue once at a time (tensor_queue.cc
   AddToTensorQueue refuses a duplicate name), so occurrence n of a name rode
   in a call no later than the first call that started after occurrence
   n + 1 was enqueued: every tensor expires, and the tensors a call can
   carry are about one step's, however long the run.
5. Order within a cycle: cached responses in ascending cache-bit order (a
   std::set), uncached ones after them in the order their last request
   arrived; a tensor's bit is given at its first response, in response order
   (response_cache.cc put).  FuseResponses packs that list front to back: a
   fused call is a prefix of its dtype's tensors in that order.

So, per family and per cycle, in call order: a call whose receive buffer is
the output of an open tensor of the same bytes carries exactly that tensor
(method "buffer").  The cycle's other calls of one dtype carry, together, a
set S of the open tensors (those not carried for certain and not expired)
that were enqueued before the cycle's upper bound, holding every open
tensor past its lower bound, whose bytes sum to the calls'.  When exactly
one such set exists (by far the common case: the cycle carried every tensor
queued before it began) the cycle's set is certain; a single call gets it,
several calls split it, each certain when its bytes pick one subset of the
set.  When more than one set fits (layers of one shape queued while the
cycle began), every call of the cycle is *ambiguous*: `ways_log10` is the
base-10 logarithm of the number of sets that fit (an exact integer count,
never a float overflow), `candidates` every tensor some fitting set holds,
and the set shown is the likeliest by Horovod's own order (point 5: the
earliest queued; split by cache-bit order).  The search over groups of
equal-sized tensors is bounded (SEARCH_BUDGET nodes per question): past it
the count is a lower bound (`ways_bound`) and the candidates are every open
tensor of the dtype.  A later call that names a tensor by its buffer takes
it back from an ambiguous call, which then takes another fitting tensor; an
ambiguous call whose alternatives all end up carried elsewhere with
certainty is resolved by elimination.  A call that no subset explains is
left unmatched and counted.  Every tensor row says which it is
(`certainty`: certain, ambiguous, unmatched, or not inferred when the time
budget ran out).

Bounds: each cycle looks only at the open tensors (point 4 keeps them to
about a step's), so time and memory follow the tensors per step, not the
length of the run or the number of equal-sized tensors; measured in docs/validation.md.

Readiness (which rank enqueued a tensor last, and how much later) comes from
the same records on every rank read: it is there for every step, not only
for the negotiations the timeline shows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats import record as F
from profiler.formats.lineage import LINEAGE_COLUMNS
from profiler.postjob.classify import classify, is_horovod_row

__all__ = ["FAMILIES", "infer", "solve_subset", "compare", "with_timeline", "MAX_RANKS",
           "EVIDENCE_COLUMNS", "evidence", "cycles"]

#: Ranks whose records are read as evidence (rank 0 and the next ones).
MAX_RANKS = 8
#: The per-rank columns the inference reads (the rest of a rank's dataset is
#: not loaded for the other ranks' evidence); the last three are computed
#: (cycles) and kept by `evidence`.
EVIDENCE_COLUMNS = ("op", "backend", "kind", "seq", "comm", "track", "thread_kind",
                    "t_start_ns", "t_end_ns", "bytes", "dtype", "redop", "root", "buf", "rc",
                    "cyc_seq", "cyc_start_ns", "cyc_floor_ns")
#: Seconds of inference per merge, which runs in rank 0's exit.  Each cycle
#: looks at the open tensors only (about a step's: docs/validation.md has the figures).
#: Beyond the budget the remaining calls are not inferred, and the lineage
#: says so (the first calls of a run show its packing: it repeats per step).
TIME_BUDGET_S = 30.0
#: Search budget per question (nodes of the subset search): past it the
#: number of fitting sets is a lower bound and the call is ambiguous.
SEARCH_BUDGET = 20_000
#: Alternative count vectors remembered per question.
MAX_SOLUTIONS = 64


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
# the subset search
# --------------------------------------------------------------------------

@dataclass
class Subsets:
    """Ways to pick tensors of the given group sizes summing to a target."""

    vectors: list[tuple[int, ...]]   # per group: how many of it (<= MAX_SOLUTIONS)
    assignments: int                 # number of distinct tensor sets (all vectors): exact int
    exhausted: bool = False          # search budget ran out: not all ways are known
    used: frozenset[int] = frozenset()  # groups some fitting vector takes (all, not 64)

    @property
    def log10(self) -> float:
        """log10 of the number of sets (a Python int of any size: no overflow)."""
        return math.log10(self.assignments) if self.assignments > 0 else 0.0

    @property
    def unique(self) -> bool:
        return self.assignments == 1 and not self.exhausted


def solve_subset(weights: Sequence[int], counts: Sequence[int], target: int,
                 budget: int | None = None) -> Subsets:
    """All count vectors k (0 <= k_g <= counts[g]) with sum k_g * weights[g] ==
    target (the first MAX_SOLUTIONS), and the number of tensor sets they
    stand for (sum over vectors of prod C(counts[g], k_g), an exact integer).
    At most `budget` (SEARCH_BUDGET) nodes are visited: beyond, `exhausted`
    and the count is a lower bound."""
    n = len(weights)
    total = sum(w * c for w, c in zip(weights, counts))
    if target < 0 or target > total:
        return Subsets([], 0)
    if target == total:
        return Subsets([tuple(counts)], 1, used=frozenset(g for g in range(n) if counts[g]))
    if target == 0:
        return Subsets([tuple([0] * n)], 1)
    # Search the smaller side: the tensors left out when they are fewer bytes.
    flip = total - target < target
    goal = total - target if flip else target
    order = sorted(range(n), key=lambda g: -weights[g])
    ws = [weights[g] for g in order]
    cs = [counts[g] for g in order]
    suffix = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + ws[i] * cs[i]
    dead: set[tuple[int, int]] = set()
    found: list[tuple[int, ...]] = []
    used: set[int] = set()
    ways = 0
    left = [SEARCH_BUDGET if budget is None else budget]
    pick = [0] * n

    def walk(i: int, rem: int) -> bool:
        nonlocal ways
        left[0] -= 1
        if left[0] < 0:
            return True
        if rem == 0:
            vec = [0] * n
            for j, g in enumerate(order):
                kj = pick[j] if j < i else 0
                vec[g] = cs[j] - kj if flip else kj
            m = 1
            for g in range(n):
                m *= math.comb(counts[g], vec[g])
                if vec[g]:
                    used.add(g)
            ways += m
            if len(found) < MAX_SOLUTIONS:
                found.append(tuple(vec))
            return True
        if i == n or rem > suffix[i] or (i, rem) in dead:
            return False
        hit = False
        w = ws[i]
        for k in range(min(cs[i], rem // w), -1, -1):
            pick[i] = k
            if walk(i + 1, rem - k * w):
                hit = True
            if left[0] < 0:
                break
        pick[i] = 0
        if not hit:
            dead.add((i, rem))
        return hit

    walk(0, goal)
    return Subsets(found, ways, exhausted=left[0] < 0, used=frozenset(used))


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
# inference
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


class _Family:
    """The inference of one family (module notes): its state and its steps.

    State per tensor: `owner` (the call showing it, -1 none), `closed`
    (carried for certain by a call so far, which one may be ambiguous: no
    later call can take it) and `claims` (the open ambiguous calls that
    might hold it: those that show it or list it among their candidates).
    A tensor neither closed nor claimed has not been carried yet."""

    def __init__(self, fam: Family, ev: _Evidence, stats: dict[str, int]) -> None:
        self.fam, self.ev, self.stats = fam, ev, stats
        subs, calls = ev.subs, ev.calls
        n_sub, n_call = len(subs), len(calls)
        self.n_call = n_call
        self.owner = np.full(n_sub, -1, dtype=np.int64)
        self.closed = np.zeros(n_sub, dtype=bool)
        self.claims: dict[int, set[int]] = {}
        self.open: dict[int, _Call] = {}  # open ambiguous calls
        self.result: dict[int, _Call] = {}
        self.weights = ev.weights
        sub_t = ev.sub_t
        self.sub_buf = subs["buf"].to_numpy(dtype=np.int64)
        self.sub_root = subs["root"].to_numpy(dtype=np.int64)
        self.sub_dtype = subs["dtype"].astype(str).to_numpy()
        self.sub_ps = subs["ps"].to_numpy(dtype=np.int64)
        self.names = subs["name"].to_numpy()
        self.call_bytes = calls["bytes"].to_numpy(dtype=np.int64)
        self.call_buf = calls["buf"].to_numpy(dtype=np.int64) if "buf" in calls.columns \
            else np.zeros(n_call, dtype=np.int64)
        self.call_root = calls["root"].to_numpy(dtype=np.int64)
        self.call_dt = [_CALL_DTYPES.get(str(d)) for d in calls["dtype"].astype(str).tolist()] \
            if "dtype" in calls.columns and fam is not ADASUM else [None] * n_call
        self.call_comm = calls["comm"].to_numpy() if "comm" in calls.columns \
            else np.zeros(n_call)
        # readiness: the last enqueue over the ranks read (Horovod serves a
        # cycle's new tensors in the order their last request came)
        ready = np.where(np.isfinite(sub_t), sub_t, -np.inf).max(axis=1) if n_sub else \
            np.zeros(0)
        self.ready = np.where(np.isfinite(ready), ready, sub_t[:, 0] if n_sub else ready)
        self.position = np.empty(n_sub, dtype=np.int64)
        self.position[np.lexsort((np.arange(n_sub),
                                  np.nan_to_num(self.ready, nan=np.inf)))] = np.arange(n_sub)
        # point 4: occurrence n of a name left Horovod's table (just before its
        # call, in its cycle's perform phase, after the cycle's first call)
        # before occurrence n + 1 was enqueued (at the latest at the end of its
        # record): it rides in no cycle that began on rank 0 after that.  A
        # call with no cycle known: in no call after the first that started
        # after that enqueue began.
        key = pd.MultiIndex.from_arrays([subs["name"].to_numpy(), self.sub_ps])
        self.nxt_end = subs["t_end_ns"].groupby(key, sort=False).shift(-1).to_numpy(
            dtype=np.float64)
        nxt = subs["t_start_ns"].groupby(key, sort=False).shift(-1).to_numpy(dtype=np.float64)
        starts0 = np.nan_to_num(ev.call_t[:, 0], nan=-np.inf) if n_call else np.zeros(0)
        self.expiry = np.where(np.isfinite(nxt), np.searchsorted(starts0, nxt, side="right"),
                               n_call)
        self.has_cycle = np.asarray([c[0] != "call" for c in ev.cycle], dtype=bool)
        # which communicator serves which process set: the lower bound holds
        # for a set's tensors in its own cycles only; known when the family has
        # one of each, for the global set from the communicator of the job's
        # size, and learnt from the calls that carry a set's tensor for certain
        self.ps_comm: dict[int, Any] = {}
        comms = list(dict.fromkeys(np.asarray(self.call_comm).tolist()))
        sizes = calls["comm_size"].to_numpy() if "comm_size" in calls.columns else None
        if len(comms) == 1 and len(set(self.sub_ps.tolist())) == 1:
            self.ps_comm[int(self.sub_ps[0])] = comms[0]
        elif sizes is not None:
            whole = list(dict.fromkeys(np.asarray(self.call_comm)[sizes == ev.world].tolist()))
            if len(whole) == 1:
                self.ps_comm[0] = whole[0]
        self.bits: dict[str, int] = {}  # Horovod's cache order: a name's first carriage

    # -- keys ---------------------------------------------------------------

    def order_key(self, s: int) -> tuple[int, float, int]:
        """Horovod's order within a cycle (point 5): cached names by their bit
        (their first carriage), then new ones by readiness."""
        b = self.bits.get(self.names[s])
        return (0, float(b), 0) if b is not None else \
            (1, float(self.ready[s]), int(self.position[s]))

    def ready_key(self, s: int) -> tuple[float, int]:
        """Which of equal tensors a cycle most likely took: the earliest ready."""
        return (float(self.ready[s]), int(self.position[s]))

    # -- state --------------------------------------------------------------

    def _claim(self, c: _Call) -> None:
        self.open[c.k] = c
        for s in set(c.candidates) | set(c.tensors):
            self.claims.setdefault(int(s), set()).add(c.k)

    def _release(self, c: _Call) -> None:
        if self.open.pop(c.k, None) is None:
            return
        for s in set(c.candidates) | set(c.tensors):
            got = self.claims.get(int(s))
            if got is not None:
                got.discard(c.k)
                if not got:
                    del self.claims[int(s)]

    def hold(self, k: int, c: _Call) -> None:
        for s in c.tensors:
            self.owner[s] = k
        self.result[k] = c
        if c.certain:
            self.closed[c.tensors] = True
            for s in c.tensors:
                self.ps_comm.setdefault(int(self.sub_ps[s]), self.call_comm[k])
        else:
            self._claim(c)
        if self.fam.key in ("allreduce", "allgather", "alltoall"):  # the cached responses
            for s in sorted(c.tensors, key=self.order_key):
                self.bits.setdefault(self.names[s], len(self.bits))

    def certain_now(self, c: _Call, method: str) -> None:
        """An ambiguous call found to have no alternative left."""
        self._release(c)
        c.certain, c.confidence, c.candidates, c.method = True, 1.0, [], method
        c.ways_log10, c.ways_bound = 0.0, False
        self.closed[c.tensors] = True
        self.stats["ambiguous"] -= 1
        self.stats["by_elimination"] += 1

    def take_back(self, s: int) -> None:
        """Tensor s is needed elsewhere: the ambiguous call showing it shows
        another pending candidate of the same size and dtype instead."""
        k = int(self.owner[s])
        if k < 0:
            return
        call = self.result[k]
        self.owner[s] = -1
        if s not in call.tensors:
            return
        w, dt = self.weights, self.sub_dtype
        swap = [x for x in call.candidates if x not in call.tensors and self.owner[x] < 0
                and not self.closed[x] and w[x] == w[s] and dt[x] == dt[s]]
        i = call.tensors.index(s)
        if swap:
            call.tensors[i] = swap[0]
            self.owner[swap[0]] = k
        else:
            del call.tensors[i]
            call.broken = True
            call.certain = False
            call.confidence = 0.0

    # -- the pass -------------------------------------------------------------

    def run(self, deadline: float) -> int:
        ev, n_call = self.ev, self.n_call
        sub_t = ev.sub_t
        groups: list[list[int]] = []
        for k in range(n_call):
            if groups and ev.cycle[groups[-1][0]] == ev.cycle[k]:
                groups[-1].append(k)
            else:
                groups.append([k])
        # admission: tensors in rank 0's enqueue order, admitted once enqueued
        # before a cycle's upper bound on rank 0 (cycles come in rank 0's order)
        times0 = sub_t[:, 0] if len(sub_t) else np.zeros(0)
        order0 = np.argsort(np.nan_to_num(times0, nan=-np.inf), kind="stable")
        unknown0 = np.isnan(times0[order0])
        live = order0[unknown0]
        known = order0[~unknown0]
        known_t = times0[known]
        admitted = 0
        for gi, G in enumerate(groups):
            if gi % 16 == 0 and time.monotonic() > deadline:
                self.stats["not_inferred"] += n_call - G[0]
                return G[0]
            k1 = G[0]
            ub = ev.upper[k1]
            u0 = ub[0]
            upto = len(known) if np.isnan(u0) else int(np.searchsorted(known_t, u0, "left"))
            if upto > admitted:
                live = np.concatenate([live, known[admitted:upto]])
                admitted = upto
            live = live[~self.closed[live] & (self.expiry[live] >= k1)]
            if self.has_cycle[k1]:
                live = live[~(self.nxt_end[live] <= u0)]
            self.cycle(G, live, ub)
        self.eliminate()
        return n_call

    def cycle(self, G: list[int], live: np.ndarray, ub: np.ndarray) -> None:
        ev = self.ev
        k1 = G[0]
        comm = self.call_comm[k1]
        sub_t = ev.sub_t
        st = sub_t[live]
        before = np.isnan(st) | np.isnan(ub)[None, :] | (st < ub[None, :])
        el = live[before.all(axis=1)]
        if self.ps_comm and len(el):  # a set served on another communicator: not here
            other = np.asarray([self.ps_comm.get(int(self.sub_ps[x]), comm) != comm
                                for x in el], dtype=bool)
            el = el[~other]
        el = el[np.argsort(self.position[el], kind="stable")]
        must = np.zeros(len(self.owner), dtype=bool)
        if ev.all_ranks and len(el) and self.has_cycle[k1]:
            fl = ev.floor[k1]
            if np.isfinite(fl).all():
                te = ev.sub_te[el]
                own = np.asarray([self.ps_comm.get(int(self.sub_ps[x])) == comm for x in el],
                                 dtype=bool)
                m = np.isfinite(te).all(axis=1) & (te < fl[None, :]).all(axis=1) & own
                must[el[m]] = True  # carried by the end of this cycle
        rest: list[int] = []
        # 1. a call in one tensor's output memory carries that tensor
        by_buf: dict[tuple[int, int], list[int]] = {}
        if (self.call_buf[G] != 0).any():
            for s in el.tolist():
                if self.sub_buf[s] != 0:
                    by_buf.setdefault((int(self.sub_buf[s]), int(self.weights[s])), []).append(s)
        for k in G:
            b = int(self.call_bytes[k])
            if self.call_buf[k] != 0:
                hit = [s for s in by_buf.get((int(self.call_buf[k]), b), ())
                       if not self.closed[s]]
                if hit:
                    free = [s for s in hit if self.owner[s] < 0 and s not in self.claims]
                    s = (free or [s for s in hit if self.owner[s] < 0] or hit)[0]
                    self.take_back(s)
                    self.hold(k, _Call(k, [s], True, 1.0, [], "buffer"))
                    must[s] = False
                    self.stats["by_buffer"] += 1
                    continue
            rest.append(k)
        if not rest:
            return
        el = el[~self.closed[el]]
        # 2. calls never fused: one tensor each, the earliest of its bytes
        if not self.fam.fused:
            for k in rest:
                self.single(k, el)
            return
        # 3. fused calls: per dtype, the cycle's set, then its split
        classes: dict[tuple[str, ...] | None, list[int]] = {}
        for k in rest:
            classes.setdefault(self.call_dt[k], []).append(k)
        for dts, ks in classes.items():
            if dts is None:  # a datatype that names no dtype: per call, as it fits
                for k in ks:
                    self.fused([k], list(dict.fromkeys(self.sub_dtype[el].tolist())), el, must)
            else:
                self.fused(ks, list(dts), el, must)

    def single(self, k: int, el: np.ndarray) -> None:
        b = int(self.call_bytes[k])
        fit = [int(s) for s in el if self.weights[s] == b and not self.closed[s]
               and (self.fam.key != "broadcast" or self.sub_root[s] == self.call_root[k])]
        pend = [s for s in fit if self.owner[s] < 0]
        if not pend:
            self.stats["unexplained"] += 1
            return
        s = min(pend, key=self.order_key)
        c = _Call(k, [s], True, 1.0, [], "order")
        if len(fit) > 1 or any(x in self.claims for x in fit):
            alts = set(fit) | {x for x in pend if x in self.claims}
            _ambiguous(c, math.log10(max(len(alts), 2)), False, sorted(alts))
        self.hold(k, c)
        self.stats["by_order" if c.certain else "ambiguous"] += 1

    def fused(self, ks: list[int], dtypes: Sequence[str], el: np.ndarray,
              must: np.ndarray) -> None:
        """One cycle's fused calls `ks` of one dtype class: the set they carried
        together, then its split among them.

        The set: open eligible tensors of the dtype, holding the `must` ones
        that no ambiguous call may hold, bytes summing to the calls'.  When
        open ambiguous calls might hold tensors here, the set they and this
        cycle carried together is solved first (their bytes plus this
        cycle's, every open tensor past this cycle's lower bound in it):
        when that union is unique it is closed (no later call can take any of
        it), those calls keep only the alternatives inside it (none: they
        are certain), and this cycle's set is the union less what they show,
        ambiguous exactly as they are (the boundary of the two cycles)."""
        w = self.weights
        total = int(sum(int(self.call_bytes[k]) for k in ks))
        pools = {dt: [int(s) for s in el if self.sub_dtype[s] == dt and not self.closed[s]]
                 for dt in dtypes}
        for pool in pools.values():
            if pool and self.joint(ks, total, pool, must):
                return
        best: tuple[Subsets, dict[int, list[int]], list[int], list[int]] | None = None
        ways_log10, bound, n_fit = 0.0, False, 0
        for pool in pools.values():
            if not pool:
                continue
            req = [s for s in pool if must[s] and s not in self.claims and self.owner[s] < 0]
            rs = set(req)
            free = [s for s in pool if s not in rs]
            need = total - int(w[req].sum()) if req else total
            res, g = _count(free, w, need)
            if not res.vectors and req:  # the lower bound does not hold here: drop it
                req, free = [], pool
                res, g = _count(free, w, total)
            if not res.vectors:
                continue
            n_fit += 1
            if best is None:
                best = (res, g, req, free)
                ways_log10, bound = res.log10, res.exhausted
            else:  # another dtype fits too: add its ways
                ways_log10 = math.log10(10 ** min(ways_log10, 300) + 10 ** min(res.log10, 300))
                bound = bound or res.exhausted
        if best is None:
            self.stats["unexplained"] += len(ks)
            return
        res, g, req, free = best
        certain_set = n_fit == 1 and res.unique
        cands = sorted(set(req) | set(_possible(res, g, free)))
        # the set shown: from tensors no ambiguous call may hold, when they fit,
        # else from any; the earliest ready
        clear = [s for s in free if self.owner[s] < 0 and s not in self.claims]
        need = total - int(w[req].sum()) if req else total
        rp, gp = _count(clear, w, need) if len(clear) < len(free) else (res, g)
        chosen = _pick(rp, gp, self.ready_key) if rp.vectors else \
            _pick(res, g, self.ready_key)
        S = list(req) + chosen
        if len(ks) > 1 and not certain_set:
            # a set its calls' bytes cannot split is not what they carried:
            # draw the calls from the pool (clear tensors first), the must ones in
            sizes = [int(self.call_bytes[k]) for k in ks]
            if not _partition(S, sizes, w, self.order_key, fallback=False):
                for src in (list(req) + [x for x in clear if x not in set(req)],
                            list(req) + free):
                    parts = _partition(src, sizes, w, self.order_key, budget=4_000,
                                       required=req, fallback=False)
                    if parts:
                        S = [x for part in parts for x in part]
                        break
        self.take(S, ks[0])
        if certain_set:
            self.closed[S] = True
        self.split(ks, S, certain_set, ways_log10, bound, cands)

    def take(self, S: Sequence[int], k: int) -> None:
        """Tensors S go to call k's cycle: pending ones are marked taken first
        (a swap must not hand them to another call), then those an ambiguous
        call shows are taken back from it."""
        shown = [s for s in S if self.owner[s] >= 0 and self.owner[s] != k]
        for s in S:
            if self.owner[s] < 0:
                self.owner[s] = k
        for s in shown:
            self.take_back(s)
            self.owner[s] = k

    def joint(self, ks: list[int], total: int, pool: list[int], must: np.ndarray) -> bool:
        """The union of this cycle's set and those of the open ambiguous calls
        that might hold tensors of `pool` (fused); False when it does not
        apply or is not unique (the cycle is then solved on its own)."""
        chain_ids = {k for s in pool for k in self.claims.get(s, ())}
        if not chain_ids:
            return False
        chain = [self.result[k] for k in sorted(chain_ids)]
        inpool = set(pool)
        for c in chain:
            if c.broken or c.ways_bound:
                return False
            if any(s not in inpool and not self.closed[s]
                   for s in set(c.candidates) | set(c.tensors)):
                return False  # it may hold a tensor not open here (expired): no one union
        w = self.weights
        target = total + int(sum(int(self.call_bytes[c.k]) for c in chain))
        req = [s for s in pool if must[s]]
        rs = set(req)
        free = [s for s in pool if s not in rs]
        need = target - int(w[req].sum()) if req else target
        res, g = _count(free, w, need)
        if not res.vectors:
            return False
        if not res.unique:
            return self.joint_open(ks, chain, pool, rs, res, g, need)
        ws = list(g)
        J = rs | {s for gi, wt in enumerate(ws) if res.vectors[0][gi] > 0 for s in g[wt]}
        if any(s not in J for c in chain for s in c.tensors):
            return False
        boundary: set[int] = set()
        worst = 0.0
        for c in chain:
            inside = sorted({s for s in c.candidates if s in J} | set(c.tensors))
            r, gg = _count(inside, w, int(self.call_bytes[c.k]))
            if r.unique:
                self.certain_now(c, "elimination")
                continue
            self._release(c)
            c.candidates = _possible(r, gg, inside)
            c.ways_log10, c.ways_bound = r.log10, r.exhausted
            c.confidence = 0.0 if c.ways_bound else 10.0 ** -c.ways_log10
            # what this cycle might have carried instead of what it shows: any
            # of them (a tensor can trade for several smaller ones)
            boundary |= set(c.candidates)
            worst = max(worst, c.ways_log10)
        self.closed[sorted(J)] = True
        S = sorted((s for s in J if self.owner[s] < 0
                    or self.owner[s] not in chain_ids), key=self.ready_key)
        for s in S:
            self.owner[s] = ks[0]
        cands = sorted(boundary | set(S))
        self.split(ks, S, not boundary, worst, False, cands)
        return True

    def joint_open(self, ks: list[int], chain: list[_Call], pool: list[int], req: set[int],
                   res: Subsets, g: dict[int, list[int]], need: int) -> bool:
        """The union is not unique either (this cycle has its own boundary):
        the likeliest union that keeps what the open calls show (the earliest
        ready), and this cycle's set is the rest of it, ambiguous with every
        tensor some fitting union holds.  Nothing is closed: the next cycle
        solves the union again, with these calls in it."""
        w = self.weights
        shown = {s for c in chain for s in c.tensors}
        free = [s for s in pool if s not in req and s not in shown]
        r2, g2 = _count(free, w, need - int(w[sorted(shown - req)].sum()))
        if not r2.vectors:
            return False
        S = sorted((set(req) - shown) | set(_pick(r2, g2, self.ready_key)), key=self.ready_key)
        for s in S:
            self.owner[s] = ks[0]
        cands = sorted(set(S) | set(_possible(res, g, [s for s in pool if s not in req]))
                       | {s for c in chain for s in c.candidates})
        self.split(ks, S, False, res.log10, res.exhausted, cands)
        return True

    def split(self, ks: list[int], S: list[int], certain_set: bool, ways_log10: float,
              bound: bool, cands: Sequence[int]) -> None:
        """The cycle's set S among its calls `ks`: in Horovod's order, each call
        a prefix of what is left (FuseResponses); by bytes when that does not
        fit.  A call is certain when the set is and its bytes pick one subset
        of what the certain calls before it left."""
        w = self.weights
        S = sorted(S, key=self.order_key)
        parts: list[list[int]] = []
        i = 0
        for k in ks:
            b, acc, part = int(self.call_bytes[k]), 0, []
            while i < len(S) and acc < b:
                acc += int(w[S[i]])
                part.append(S[i])
                i += 1
            if acc != b:
                parts = []
                break
            parts.append(part)
        if not parts or i != len(S):  # not in order: by bytes, the earliest that fit all
            parts = _partition(S, [int(self.call_bytes[k]) for k in ks], w, self.order_key)
        left_c = list(S)
        for k, part in zip(ks, parts):
            if not part:
                self.stats["unexplained"] += 1
                continue
            c = _Call(k, list(part), True, 1.0, [], "bytes")
            if not certain_set:
                _ambiguous(c, ways_log10, bound, cands)
            if len(ks) > 1:
                r, gg = _count(left_c, w, int(self.call_bytes[k]))
                if not r.unique:
                    _ambiguous(c, ways_log10 + r.log10, bound or r.exhausted,
                               _possible(r, gg, left_c) if c.certain else list(cands) + left_c)
            if c.certain:
                left_c = [s for s in left_c if s not in part]
            self.hold(k, c)
            self.stats["by_bytes" if c.certain else "ambiguous"] += 1
        shown = {s for part in parts for s in part}
        for s in S:  # taken for the set but in no call's part: pending again
            if s not in shown and self.owner[s] == ks[0] and (
                    ks[0] not in self.result or s not in self.result[ks[0]].tensors):
                self.owner[s] = -1

    def eliminate(self) -> None:
        """An ambiguous call whose alternatives were all carried by certain
        calls has no alternative left."""
        certain_owner = {s for c in self.result.values() if c.certain for s in c.tensors}
        for c in self.result.values():
            if c.certain or c.broken or c.ways_bound:
                continue
            alt = [s for s in c.candidates if s not in c.tensors and s not in certain_owner]
            if not alt:
                self.certain_now(c, "elimination")


def _infer_family(fam: Family, ev: _Evidence, stats: dict[str, int],
                  deadline: float = math.inf) -> tuple[dict[int, _Call], int]:
    """Assign this family's tensors to its calls, cycle by cycle (module notes,
    _Family); returns the calls' answers and the index of the first call not
    inferred (len(calls) when the `deadline`, time.monotonic, was not reached)."""
    f = _Family(fam, ev, stats)
    stop = f.run(deadline)
    return f.result, stop


def _groups(pool: Sequence[int], weights: np.ndarray) -> dict[int, list[int]]:
    g: dict[int, list[int]] = {}
    for s in pool:
        g.setdefault(int(weights[s]), []).append(int(s))
    return g


def _count(pool: Sequence[int], weights: np.ndarray, target: int) -> tuple[Subsets,
                                                                          dict[int, list[int]]]:
    g = _groups(pool, weights)
    ws = list(g)
    return solve_subset(ws, [len(g[w]) for w in ws], target), g


def _possible(res: Subsets, groups: Mapping[int, list[int]], pool: Sequence[int]) -> list[int]:
    """Every tensor some fitting set holds (all of the pool when the search was cut)."""
    if res.exhausted:
        return sorted(int(s) for s in pool)
    ws = list(groups)
    return sorted({s for g, w in enumerate(ws) if g in res.used for s in groups[w]})


def _pick(res: Subsets, groups: Mapping[int, list[int]], key: Any) -> list[int]:
    """The fitting set Horovod most likely served: of each group the earliest
    in its order (`key`), the vector whose tensors come earliest."""
    ws = list(groups)
    srt = {w: sorted(groups[w], key=key) for w in ws}

    def late(v: tuple[int, ...]) -> tuple[Any, ...]:
        ks = sorted((key(srt[w][i]) for g, w in enumerate(ws) for i in range(v[g])),
                    reverse=True)
        return tuple(ks)

    vec = min(res.vectors, key=late)
    return [srt[w][i] for g, w in enumerate(ws) for i in range(vec[g])]


def _partition(S: Sequence[int], sizes: Sequence[int], weights: np.ndarray, key: Any,
               budget: int = 2_000, required: Sequence[int] | None = None,
               fallback: bool = True) -> list[list[int]]:
    """S split into parts of the given byte sizes, in order, each part the
    earliest tensors (by `key`) of a fitting count vector, searched depth
    first over at most `budget` parts tried; every tensor of S used, or,
    with `required`, every tensor of that (S then a pool to draw from).
    None found: each part as it fits ([] for a part none fits), or [] when
    not `fallback`."""
    left_budget = [budget]
    need = set(S) if required is None else set(required)

    def go(i: int, left: list[int]) -> list[list[int]] | None:
        if i == len(sizes):
            return [] if not (need & set(left)) else None
        r, g = _count(left, weights, sizes[i])
        ws = list(g)
        srt = {w: sorted(g[w], key=key) for w in ws}
        for v in sorted(r.vectors, key=lambda v: tuple(sorted(
                (key(srt[w][j]) for gi, w in enumerate(ws) for j in range(v[gi])),
                reverse=True))):
            left_budget[0] -= 1
            if left_budget[0] < 0:
                return None
            part = [srt[w][j] for gi, w in enumerate(ws) for j in range(v[gi])]
            taken = set(part)
            rest = go(i + 1, [s for s in left if s not in taken])
            if rest is not None:
                return [part, *rest]
        return None

    found = go(0, list(S))
    if found is not None:
        return found
    if not fallback:
        return []
    parts, left = [], list(S)  # no exact partition: each call as it fits, in order
    for b in sizes:
        r, g = _count(left, weights, b)
        part = _pick(r, g, key) if r.vectors else []
        parts.append(part)
        left = [s for s in left if s not in set(part)]
    return parts


def infer(frames: Mapping[int, pd.DataFrame], names: Mapping[int, Sequence[str]], *,
          threshold: int | None = None, world_size: int | None = None,
          budget_s: float = TIME_BUDGET_S) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The lineage table (LINEAGE_COLUMNS) from the records of the ranks in
    `frames` (rank 0 required: its calls and times are the table's), and what
    was found (counts per method, tensors, calls; not_inferred: calls left
    when the `budget_s` seconds of inference ran out; seconds: the time it
    took)."""
    t_begin = time.monotonic()
    stats = {"by_buffer": 0, "by_bytes": 0, "by_order": 0, "by_elimination": 0,
             "ambiguous": 0, "unexplained": 0, "not_inferred": 0}
    deadline = t_begin + budget_s
    info: dict[str, Any] = {"source": "records", "ranks_read": sorted(frames),
                            "fusion_threshold": threshold}
    ranks = sorted(frames)
    if 0 not in frames:
        return _empty(), {**info, "reason": "no rank-0 records"}
    subs_by_rank = {r: _tensor_rows(frames[r], names.get(r, ())) for r in ranks}
    calls_by_rank = {r: _data_calls(frames[r]) for r in ranks}
    subs0 = subs_by_rank[0]
    info["tensor_records"] = int(len(subs0))
    if subs0.empty:
        return _empty(), {**info, "reason": "no tensor records on rank 0"}
    world = world_size or len(ranks)
    all_ranks = len(ranks) >= world and ranks == list(range(len(ranks)))
    calls0 = calls_by_rank[0]
    rows: list[pd.DataFrame] = []
    errors: list[str] = []
    fused_id = 0
    per_family: dict[str, Any] = {}
    fam_of_prefix = _families(subs0)
    adasum_calls = np.zeros(len(calls0), dtype=bool)
    if any(f is ADASUM for f in fam_of_prefix) and len(calls0):
        adasum_calls = ((calls0["op"].astype(str) == "allreduce")
                        & (calls0["dtype"].astype(str) == "MPI_DOUBLE")
                        & (calls0["bytes"] % ADASUM_BYTES_PER_TENSOR == 0)).to_numpy(dtype=bool)
    for fam in dict.fromkeys(f for f in fam_of_prefix if f is not None):
        fsel = np.asarray([f is fam for f in fam_of_prefix], dtype=bool)
        subs = subs0.loc[fsel].reset_index(drop=True)
        csel = calls0["op"].astype(str).isin(fam.record_ops).to_numpy(dtype=bool) \
            if len(calls0) else np.zeros(0, dtype=bool)
        csel = csel & (adasum_calls if fam is ADASUM else ~adasum_calls)
        calls = calls0.loc[csel].reset_index(drop=True)
        fstats = dict.fromkeys(stats, 0)
        try:
            ev = _family_evidence(fam, subs, calls, subs_by_rank, calls_by_rank, ranks,
                                  world, all_ranks)
            result, stop = _infer_family(fam, ev, fstats, deadline)
            part = _rows(fam, ev, result, stop, fused_id, threshold, ranks)
        except Exception as exc:  # one family's failure costs only its own calls
            text = " ".join(str(exc).split())[:160]
            errors.append(f"{fam.key}: inference failed ({type(exc).__name__}: {text})")
            fstats = dict.fromkeys(stats, 0)
            fstats["not_inferred"] = len(calls)
            part = _bare_rows(fam, subs)
        for kk, v in fstats.items():
            stats[kk] += v
        per_family[fam.key] = {"tensors": int(len(subs)), "calls": int(len(calls)),
                               **{kk: v for kk, v in fstats.items() if v}}
        rows.append(part)
        fused_id += len(calls)
    table = pd.concat(rows, ignore_index=True) if rows else _empty()
    table = table.sort_values(["t_start_ns"], kind="stable").reset_index(drop=True)
    info.update(stats)
    info["families"] = per_family
    info["rows"] = int(len(table))
    info["tensors"] = int(table["tensor"].nunique()) if len(table) else 0
    info["matched_calls"] = int(table.loc[table["matched"], "fused_id"].nunique()) \
        if len(table) else 0
    info["certainty"] = {str(k): int(v) for k, v in
                         table["certainty"].value_counts().items()} if len(table) else {}
    info["seconds"] = round(time.monotonic() - t_begin, 3)
    if errors:
        info["errors"] = errors
    return table[LINEAGE_COLUMNS], info


def _bare_rows(fam: Family, subs: pd.DataFrame) -> pd.DataFrame:
    """Every tensor of a family whose inference failed: listed, not inferred."""
    ev = _Evidence(subs, subs.iloc[0:0].assign(op="", comm=0, seq=0, bytes=0),
                   subs[["t_start_ns"]].to_numpy(dtype=np.float64),
                   subs[["t_end_ns"]].to_numpy(dtype=np.float64),
                   subs["bytes"].to_numpy(dtype=np.int64), np.zeros((0, 1)),
                   np.zeros((0, 1)), np.zeros((0, 1)), [], False)
    out = _rows(fam, ev, {}, 0, 0, None, [0])
    out["certainty"] = "not inferred"
    return out


def bare(frame: pd.DataFrame, names: Sequence[str], reason: str) -> tuple[pd.DataFrame,
                                                                         dict[str, Any]]:
    """The lineage when the inference failed as a whole: every tensor rank 0
    handed to Horovod, none matched, each "not inferred"; the reason in the
    info (errors)."""
    info: dict[str, Any] = {"source": "records", "errors": [reason]}
    try:
        subs0 = _tensor_rows(frame, names)
        fams = _families(subs0)
        parts = [_bare_rows(f, subs0.loc[np.asarray([x is f for x in fams], dtype=bool)]
                            .reset_index(drop=True))
                 for f in dict.fromkeys(x for x in fams if x is not None)]
        table = pd.concat(parts, ignore_index=True) if parts else _empty()
    except Exception:  # not even the tensor records: no table
        table = _empty()
    info["tensor_records"] = int(len(table))
    return table[LINEAGE_COLUMNS] if len(table) else _empty(), info


def _families(subs: pd.DataFrame) -> list[Family | None]:
    """Each tensor's family: its name's prefix, Adasum by its reduction."""
    red = subs["redop"].astype(str).to_numpy() if "redop" in subs.columns else \
        np.full(len(subs), "")
    return [ADASUM if f is _AR and r == "user" else f
            for f, r in zip((FAMILIES.get(p) for p in subs["prefix"]), red)]


def _family_evidence(fam: Family, subs: pd.DataFrame, calls: pd.DataFrame,
                     subs_by_rank: Mapping[int, pd.DataFrame],
                     calls_by_rank: Mapping[int, pd.DataFrame], ranks: Sequence[int],
                     world: int, all_ranks: bool) -> _Evidence:
    key = list(zip(subs["name"], subs["occurrence"]))
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
        idx = dict(zip(zip(sr["name"], sr["occurrence"]), range(len(sr))))
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


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in LINEAGE_COLUMNS})


def _rows(fam: Family, ev: _Evidence, result: Mapping[int, _Call], stop: int, id0: int,
          threshold: int | None, ranks: Sequence[int]) -> pd.DataFrame:
    subs, calls, sub_t = ev.subs, ev.calls, ev.sub_t
    n = len(subs)
    call_of = np.full(n, -1, dtype=np.int64)
    for k, c in result.items():
        for s in c.tensors:
            call_of[s] = k
    matched = call_of >= 0
    safe = np.where(matched, call_of, 0)

    def ccol(name: str, default: Any, dtype: Any) -> np.ndarray:
        if len(calls) == 0 or name not in calls.columns:
            return np.full(n, default, dtype=dtype)
        return np.where(matched, calls[name].to_numpy()[safe], default).astype(dtype)

    tb = subs["bytes"].to_numpy(dtype=np.float64)
    per_call_n = {k: len(c.tensors) for k, c in result.items()}
    per_call_b = {k: float(tb[c.tensors].sum()) for k, c in result.items()}
    n_tensors = np.asarray([per_call_n.get(int(k), 1) for k in call_of], dtype=np.int32)
    call_tb = np.asarray([per_call_b.get(int(k), math.nan) if k >= 0 else math.nan
                          for k in call_of])
    call_bytes = ccol("bytes", -1, np.int64)
    if threshold and fam.fused:
        fill = call_tb / threshold
    else:
        fill = np.full(n, math.nan)
    conf = np.asarray([result[int(k)].confidence if k >= 0 else 0.0 for k in call_of])
    names = subs["name"].to_numpy()
    cands = [";".join(names[result[int(k)].candidates].tolist()) if k >= 0 else ""
             for k in call_of]
    method = [result[int(k)].method if k >= 0 else "" for k in call_of]
    ways = np.asarray([result[int(k)].ways_log10 if k >= 0 else math.nan for k in call_of])
    bound = np.asarray([bool(result[int(k)].ways_bound) if k >= 0 else False
                        for k in call_of])
    # a tensor left unmatched when the budget stopped the inference could
    # have been carried by a call not inferred
    late = np.zeros(n, dtype=bool)
    if stop < len(calls):
        nxt = subs.groupby("name", sort=False)["t_start_ns"].shift(-1).to_numpy(
            dtype=np.float64)
        t_stop = float(np.nan_to_num(ev.call_t[stop, 0], nan=-np.inf))
        late = ~(np.isfinite(nxt) & (nxt < t_stop))
    certainty = np.where(
        matched, np.where(conf >= 1.0, "certain", "ambiguous"),
        np.where(late, "not inferred", "unmatched")).astype(object)
    enq = subs["t_start_ns"].to_numpy(dtype=np.float64)
    seen = np.isfinite(sub_t)
    n_ready = seen.sum(axis=1).astype(np.int32)
    t_max = np.where(seen.any(axis=1), np.nanmax(np.where(seen, sub_t, -np.inf), axis=1),
                     np.nan)
    t_min = np.where(seen.any(axis=1), np.nanmin(np.where(seen, sub_t, np.inf), axis=1),
                     np.nan)
    last = np.where(seen.any(axis=1),
                    np.asarray(ranks)[np.argmax(np.where(seen, sub_t, -np.inf), axis=1)], -1)
    c_start = ccol("t_start_ns", -1, np.int64)
    c_end = ccol("t_end_ns", -1, np.int64)
    gathered = fam.gathered
    agree = matched & np.isfinite(call_tb) & (call_tb == call_bytes) & (not gathered)
    dtype = [_DTYPE_SHOWN.get(d, d) for d in subs["dtype"].astype(str).tolist()]
    return pd.DataFrame({
        "step": ccol("step", -1, np.int64).astype(np.int32),
        "occurrence": subs["occurrence"].astype(np.int32),
        "tensor": subs["name"].astype(str),
        "op": fam.horovod_op,
        "comm_activity": fam.activity,
        "fused_id": np.where(matched, call_of + id0, -1).astype(np.int64),
        "n_tensors": n_tensors,
        "tensor_bytes": tb,
        "call_tensor_bytes": call_tb,
        "fill_ratio": fill,
        "dtype": dtype,
        "shape": "",
        "t_start_ns": enq,
        "t_end_ns": np.where(matched, c_end, np.nan).astype(np.float64),
        "negotiation_ns": np.nan,
        "neg_start_ns": np.nan,
        "neg_end_ns": np.nan,
        "wait_for_data_ns": np.nan,
        "ready_ranks": n_ready,
        "last_ready_rank": last.astype(np.int32),
        "ready_spread_ns": np.where(n_ready > 1, t_max - t_min, np.nan),
        "matched": matched,
        "call_op": np.where(matched, ccol("op", "", object), ""),
        "call_comm": ccol("comm", 0, np.uint64),
        "call_seq": ccol("seq", -1, np.int64),
        "call_t_start_ns": c_start,
        "call_t_end_ns": c_end,
        "call_dur_ns": ccol("dur_ns", -1, np.int64),
        "call_bytes": call_bytes,
        "bytes_agree": agree,
        "complete": True,
        "source": "records",
        "confidence": conf,
        "candidates": cands,
        "method": method,
        "certainty": certainty,
        "ways_log10": ways,
        "ways_bound": bound,
        "enqueue_ns": enq,
        "ready_ns": t_max,
        "queue_ns": np.where(matched, c_start - enq, np.nan),
    })


# --------------------------------------------------------------------------
# the timeline, when there is one: what only it has, and the check
# --------------------------------------------------------------------------

def with_timeline(rec: pd.DataFrame, tl: pd.DataFrame) -> pd.DataFrame:
    """The records' lineage with the timeline's per-tensor phases (negotiation,
    wait for data, shape), matched by (tensor, occurrence)."""
    if rec.empty or tl.empty:
        return rec
    cols = ["negotiation_ns", "neg_start_ns", "neg_end_ns", "wait_for_data_ns", "shape"]
    t = tl[["tensor", "occurrence", *cols]].drop_duplicates(["tensor", "occurrence"])
    out = rec.drop(columns=cols).merge(t, on=["tensor", "occurrence"], how="left")
    out["shape"] = out["shape"].fillna("").astype(str)
    return out[list(rec.columns)]


def compare(rec: pd.DataFrame, tl: pd.DataFrame) -> dict[str, Any]:
    """Call by call, the records' tensor sets against the timeline's (the
    oracle): calls compared, equal, ambiguous with the truth among the
    candidates (and of those, how many showed the truth as the likeliest
    set), and wrong (with up to 5 examples)."""
    def sets(t: pd.DataFrame) -> dict[tuple[int, int], frozenset[str]]:
        m = t[t["matched"]]
        return {(int(c), int(s)): frozenset(g["tensor"]) for (c, s), g in
                m.groupby(["call_comm", "call_seq"], sort=False)}

    r, o = sets(rec), sets(tl)
    cand: dict[tuple[int, int], set[str]] = {}
    conf: dict[tuple[int, int], float] = {}
    if len(rec):
        m = rec[rec["matched"]]
        for (c, s), g in m.groupby(["call_comm", "call_seq"], sort=False):
            names = set(g["tensor"])
            for x in g["candidates"]:
                if x:
                    names |= set(x.split(";"))
            cand[(int(c), int(s))] = names
            conf[(int(c), int(s))] = float(g["confidence"].min())
    out: dict[str, Any] = {"calls": len(o), "equal": 0, "ambiguous_ok": 0, "wrong": 0,
                           "missing": 0, "ambiguous_shown_right": 0, "examples": []}
    for key, truth in o.items():
        got = r.get(key)
        if got is None:
            out["missing"] += 1
            continue
        if got == truth and conf.get(key, 1.0) >= 1.0:
            out["equal"] += 1
        elif conf.get(key, 1.0) < 1.0 and truth <= cand.get(key, set()):
            out["ambiguous_ok"] += 1
            out["ambiguous_shown_right"] += got == truth
        else:
            out["wrong"] += 1
            if len(out["examples"]) < 5:
                out["examples"].append({"call": list(key), "records": sorted(got),
                                        "timeline": sorted(truth)})
    out["extra"] = len(set(r) - set(o))
    return out
