"""Fusion lineage from the profiler's own records: which tensors rode in each
collective Horovod made, without Horovod's timeline.

Evidence (all recorded at the cost of one record per call or tensor):

* APP_TENSOR rows (op "tensor", profiler.collect.tensors): each tensor handed
  to Horovod on each rank, with its name, bytes, dtype, enqueue time and the
  address of its output folded to 32 bits (column ``buf``);
* the data calls of Horovod's background thread, with their bytes and the
  receive buffer, folded the same way (``buf``).

What Horovod guarantees (horovod/common/ops/mpi_operations.cc,
controller.cc, fusion_buffer_manager.cc at v0.28.1):

1. A call that carries one tensor works in that tensor's output memory: its
   receive buffer is the output's address (MPI_Allreduce, MPI_Bcast).  A call
   that carries several works in the fusion buffer, never in a tensor's.
2. A fused call carries tensors of one dtype, each exactly once; its element
   count is the sum of theirs (allreduce, reducescatter: bytes equal the sum of
   the tensors' bytes; allgather: of every rank's contributions).
   Broadcasts and alltoalls are never fused.
3. A tensor is carried by a call that starts after it was enqueued, on every
   rank (the coordinator waits for all ranks to submit it).

So, per family, in call order: a call whose receive buffer is the output of
a pending tensor of the same bytes carries exactly that tensor (confidence 1).
Otherwise the call carries a subset of the tensors pending on every rank,
of one dtype, whose bytes sum to the call's.  That subset is found exactly
(search over groups of equal-sized tensors, with memoised pruning); when
more than one subset fits, the earliest-enqueued tensors are taken (Horovod
serves them in order), the call is marked with a confidence (1 / number of
subsets that fit) and the candidates (every tensor some fitting subset
holds).  A later call that names a tensor by its buffer takes it back from an
ambiguous call, which then takes another fitting tensor; an ambiguous call
whose alternatives all end up carried elsewhere with certainty is resolved by
elimination.  A call that no subset explains is left unmatched and counted.

Readiness (which rank enqueued a tensor last, and how much later) comes from
the same records on every rank read: it is there for every step, not only
for the negotiations the timeline shows.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats.classify import classify, is_horovod_row
from profiler.formats.lineage import LINEAGE_COLUMNS

__all__ = ["FAMILIES", "infer", "solve_subset", "compare", "with_timeline", "MAX_RANKS",
           "EVIDENCE_COLUMNS", "evidence"]

#: Ranks whose records are read as evidence (rank 0 and the next ones).
MAX_RANKS = 8
#: The per-rank columns the inference reads (the rest of a rank's dataset is
#: not loaded for the other ranks' evidence).
EVIDENCE_COLUMNS = ("op", "backend", "kind", "seq", "comm", "track", "thread_kind",
                    "t_start_ns", "bytes", "dtype", "redop", "root", "buf")
#: Seconds of inference per merge, which runs in rank 0's exit: each call
#: looks at the tensors still open (pending, or held by an ambiguous call),
#: 1.3 s for 20,000 single-tensor calls on this project's 2-core machine (it
#: was 4 s, and quadratic, when every call tested every earlier tensor).
#: Beyond the budget the remaining calls are not inferred, and the lineage
#: says so (the first calls of a run show its packing: it repeats per step).
TIME_BUDGET_S = 30.0
#: Search budget per call (nodes of the subset search) before giving up.
SEARCH_BUDGET = 200_000
#: Alternative subsets remembered per call.
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
_AR = Family("allreduce", ("allreduce", "nccl_allreduce"), "ALLREDUCE", "MPI_ALLREDUCE", True)
_AG = Family("allgather", ("allgatherv",), "ALLGATHER", "MPI_ALLGATHER", True, True)
_RS = Family("reducescatter", ("reduce_scatter", "reduce_scatter_block"), "REDUCESCATTER",
             "MPI_REDUCESCATTER", True)
#: tensor name prefix (Horovod's GetOpName) -> family
FAMILIES: dict[str, Family] = {
    "allreduce": _AR, "grouped_allreduce": _AR,
    "allgather": _AG, "grouped_allgather": _AG,
    "reducescatter": _RS, "grouped_reducescatter": _RS,
    "broadcast": Family("broadcast", ("bcast", "nccl_broadcast", "nccl_bcast"), "BROADCAST",
                        "MPI_BCAST", False),
    "alltoall": Family("alltoall", ("alltoallv", "alltoall"), "ALLTOALL", "MPI_ALLTOALL", False),
}

#: hvprof dtype name of a tensor (NCCL codes) -> the torch name shown
_DTYPE_SHOWN = {"ncclInt8": "int8", "ncclUint8": "uint8", "ncclInt32": "int32",
                "ncclInt64": "int64", "ncclFloat16": "float16", "ncclFloat32": "float32",
                "ncclFloat64": "float64", "ncclBfloat16": "bfloat16"}


# --------------------------------------------------------------------------
# the subset search
# --------------------------------------------------------------------------

@dataclass
class Subsets:
    """Ways to pick tensors of the given group sizes summing to a target."""

    vectors: list[tuple[int, ...]]   # per group: how many of it (<= MAX_SOLUTIONS)
    assignments: int                 # number of distinct tensor sets (all vectors)
    exhausted: bool = False          # search budget ran out: not all ways are known


def solve_subset(weights: Sequence[int], counts: Sequence[int], target: int) -> Subsets:
    """All count vectors k (0 <= k_g <= counts[g]) with sum k_g * weights[g] ==
    target, and the number of tensor sets they stand for (sum over vectors of
    prod C(counts[g], k_g))."""
    n = len(weights)
    total = sum(w * c for w, c in zip(weights, counts))
    if target < 0 or target > total:
        return Subsets([], 0)
    if target == total:
        return Subsets([tuple(counts)], 1)
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
    ways = 0
    budget = [SEARCH_BUDGET]
    pick = [0] * n

    def walk(i: int, rem: int) -> bool:
        nonlocal ways
        budget[0] -= 1
        if budget[0] < 0:
            return True
        if rem == 0:
            vec = [0] * n
            for j, g in enumerate(order):
                kj = pick[j] if j < i else 0
                vec[g] = cs[j] - kj if flip else kj
            m = 1
            for g in range(n):
                m *= math.comb(counts[g], vec[g])
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
        pick[i] = 0
        if not hit:
            dead.add((i, rem))
        return hit

    walk(0, goal)
    return Subsets(found, ways, exhausted=budget[0] < 0)


# --------------------------------------------------------------------------
# evidence
# --------------------------------------------------------------------------

def _tensor_rows(frame: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """The APP_TENSOR rows of one rank with name, prefix and occurrence."""
    sel = frame.loc[(frame["op"] == "tensor").to_numpy(dtype=bool)]
    if sel.empty:
        return pd.DataFrame(columns=["name", "prefix", "occurrence", "t_start_ns", "bytes",
                                     "dtype", "buf", "root"])
    ids = sel["seq"].to_numpy(dtype=np.int64)
    known = (ids >= 0) & (ids < len(names))
    sel = sel.loc[known]
    ids = ids[known]
    name = np.asarray([names[i] for i in ids.tolist()], dtype=object)
    out = pd.DataFrame({
        "name": name,
        "prefix": [s.split(".", 1)[0] for s in name.tolist()],
        "t_start_ns": sel["t_start_ns"].to_numpy(dtype=np.int64),
        "bytes": sel["bytes"].to_numpy(dtype=np.int64),
        "dtype": sel["dtype"].astype(str).to_numpy(),
        "buf": (sel["buf"].to_numpy(dtype=np.int64) if "buf" in sel.columns
                else np.zeros(len(sel), dtype=np.int64)),
        "root": sel["root"].to_numpy(dtype=np.int64),
    }).sort_values("t_start_ns", kind="stable").reset_index(drop=True)
    out["occurrence"] = out.groupby("name", sort=False).cumcount().astype(np.int64)
    return out


def _data_calls(frame: pd.DataFrame) -> pd.DataFrame:
    """One rank's data calls made by Horovod's thread, in start order."""
    if len(frame) == 0:
        return frame
    kind = frame["kind"] if "kind" in frame.columns else classify(frame)
    mask = (np.asarray(kind.astype(str)) == "data") & is_horovod_row(frame)
    return frame.loc[mask].sort_values("t_start_ns", kind="stable").reset_index(drop=True)


def evidence(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of one rank's frame that `infer` reads: its tensor records
    and the data calls of Horovod's thread, in EVIDENCE_COLUMNS.  Which
    thread is Horovod's is decided on the whole frame (it may take the
    control rows' signature), so the kept calls are marked thread_kind
    "horovod": the reduced frame gives `infer` the same answer."""
    cols = [c for c in EVIDENCE_COLUMNS if c in frame.columns]
    if len(frame) == 0:
        return frame.loc[:, cols]
    kind = frame["kind"] if "kind" in frame.columns else classify(frame)
    calls = (np.asarray(kind.astype(str)) == "data") & is_horovod_row(frame)
    keep = calls | (frame["op"] == "tensor").to_numpy(dtype=bool)
    out = frame.loc[keep, cols].copy()
    out["kind"] = np.where(calls[keep], "data", "app")
    tk = np.where(calls[keep], "horovod",
                  out["thread_kind"].astype(str).to_numpy() if "thread_kind" in out.columns
                  else "other")
    out["thread_kind"] = tk
    return out.reset_index(drop=True)


@dataclass
class _Call:
    k: int
    tensors: list[int] = field(default_factory=list)   # sub ids
    certain: bool = True
    confidence: float = 1.0
    candidates: list[int] = field(default_factory=list)  # ambiguous: every possible tensor
    method: str = ""


# --------------------------------------------------------------------------
# inference
# --------------------------------------------------------------------------

def _infer_family(fam: Family, subs: pd.DataFrame, calls: pd.DataFrame,
                  sub_t: np.ndarray, call_t: np.ndarray, weights: np.ndarray,
                  stats: dict[str, int], deadline: float = math.inf) -> dict[int, _Call]:
    """Assign this family's tensors (subs, rank-0 view; sub_t: enqueue time per
    rank, NaN = unknown) to its calls (call_t: start per rank), the calls
    after `deadline` (time.monotonic) counted as not inferred."""
    n_sub = len(subs)
    owner = np.full(n_sub, -1, dtype=np.int64)  # call index k, -1 = pending
    result: dict[int, _Call] = {}
    sub_buf = subs["buf"].to_numpy(dtype=np.int64)
    sub_root = subs["root"].to_numpy(dtype=np.int64)
    sub_dtype = subs["dtype"].to_numpy()
    call_bytes = calls["bytes"].to_numpy(dtype=np.int64)
    call_buf = calls["buf"].to_numpy(dtype=np.int64) if "buf" in calls.columns else \
        np.zeros(len(calls), dtype=np.int64)
    call_root = calls["root"].to_numpy(dtype=np.int64)
    order = np.argsort(sub_t[:, 0], kind="stable")
    position = np.empty(n_sub, dtype=np.int64)
    position[order] = np.arange(n_sub)

    # Each call looks only at the tensors that could be its: enqueued on rank 0
    # before it started (calls come in rank 0's start order, so that set only
    # grows: admitted through a pointer into the enqueue order), less those an
    # earlier call carried for certain (no later call can take them).  The
    # same set as testing every tensor, in the same order, at a cost that
    # follows the pending tensors, not the length of the run.
    certain_owned = np.zeros(n_sub, dtype=bool)
    times0 = sub_t[order, 0]
    unknown = np.isnan(times0)
    live = order[unknown]  # no rank-0 time: always a candidate, as before
    known = order[~unknown]
    known_t = times0[~unknown]
    admitted = 0

    def eligible(k: int) -> np.ndarray:
        nonlocal live, admitted
        prev = result.get(k - 1)
        if prev is not None and prev.certain:
            certain_owned[prev.tensors] = True
        ct0 = call_t[k, 0]
        upto = len(known) if np.isnan(ct0) else int(np.searchsorted(known_t, ct0, "left"))
        if upto > admitted:
            live = np.concatenate([live, known[admitted:upto]])
            admitted = upto
        live = live[~certain_owned[live]]
        if unknown.any():  # keep the enqueue order the search relies on
            live = live[np.argsort(position[live], kind="stable")]
        ct = call_t[k][None, :]
        st = sub_t[live]
        before = np.isnan(st) | np.isnan(ct) | (st < ct)
        return live[before.all(axis=1)]

    def loose_of(el: np.ndarray) -> list[int]:
        """Eligible tensors held by an ambiguous call: it might have carried
        another, leaving this one for the call at hand (a call is certain only
        when it would be whatever those calls chose)."""
        return [int(s) for s in el if owner[s] >= 0 and not result[int(owner[s])].certain]

    for k in range(len(calls)):
        if k % 32 == 0 and time.monotonic() > deadline:
            stats["not_inferred"] += len(calls) - k
            break
        el = eligible(k)
        pend = el[owner[el] < 0]
        b = int(call_bytes[k])
        # 1. the call works in one tensor's output memory
        if call_buf[k] != 0:
            same_buf = el[(sub_buf[el] == call_buf[k]) & (weights[el] == b)]
            hit = [s for s in same_buf
                   if owner[s] < 0 or not result[int(owner[s])].certain]
            if hit:
                hit_p = [s for s in hit if owner[s] < 0]
                s = hit_p[0] if hit_p else hit[0]
                if owner[s] >= 0:
                    _take_back(result[int(owner[s])], s, owner, weights, sub_dtype)
                owner[s] = k
                result[k] = _Call(k, [int(s)], True, 1.0, [], "buffer")
                stats["by_buffer"] += 1
                continue
        if not fam.fused:
            same = [s for s in pend if weights[s] == b
                    and (fam.key != "broadcast" or sub_root[s] == call_root[k])]
            if not same:
                stats["unexplained"] += 1
                continue
            s = same[0]
            rivals = [int(x) for x in same] + [
                x for x in loose_of(el) if weights[x] == b
                and (fam.key != "broadcast" or sub_root[x] == call_root[k])]
            owner[s] = k
            certain = len(rivals) == 1
            result[k] = _Call(k, [int(s)], certain, 1.0 / len(rivals),
                              [] if certain else rivals, "order")
            stats["by_order"] += 1
            continue
        # 2. a fused call: a subset of one dtype summing to the call's bytes
        best: _Call | None = None
        ways_all = 0
        for dt in dict.fromkeys(sub_dtype[pend].tolist()):
            pool = [int(s) for s in pend if sub_dtype[s] == dt]
            groups: dict[int, list[int]] = {}
            for s in pool:
                groups.setdefault(int(weights[s]), []).append(s)
            ws = list(groups)
            res = solve_subset(ws, [len(groups[w]) for w in ws], b)
            if not res.vectors:
                continue
            ways_all += res.assignments
            # the vector whose earliest tensors were enqueued earliest
            vec = min(res.vectors, key=functools.partial(_lateness, groups=groups, ws=ws,
                                                         position=position))
            chosen = [groups[w][i] for g, w in enumerate(ws) for i in range(vec[g])]
            possible = sorted({groups[w][i] for v in res.vectors for g, w in enumerate(ws)
                               if v[g] > 0 for i in range(len(groups[w]))})
            certain = res.assignments == 1 and not res.exhausted
            cand = _Call(k, chosen, certain, 1.0 / max(res.assignments, 1),
                         [] if certain else possible, "bytes")
            if res.exhausted:
                cand.confidence = 0.0
            if best is None:
                best = cand
        if best is None:
            stats["unexplained"] += 1
            continue
        if ways_all > 1 and best.certain:  # another dtype fits too
            best.certain = False
            best.confidence = 1.0 / ways_all
            best.candidates = sorted(set(best.tensors))
        if best.certain:  # unique among the pending: also with the loose ones?
            dt = sub_dtype[best.tensors[0]]
            wider = [int(s) for s in pend if sub_dtype[s] == dt] + [
                s for s in loose_of(el) if sub_dtype[s] == dt]
            groups = {}
            for s in wider:
                groups.setdefault(int(weights[s]), []).append(s)
            ws = list(groups)
            res = solve_subset(ws, [len(groups[w]) for w in ws], b)
            if res.assignments > 1 or res.exhausted:
                best.certain = False
                best.confidence = 0.0 if res.exhausted else 1.0 / res.assignments
                best.candidates = sorted({groups[w][i] for v in res.vectors
                                          for g, w in enumerate(ws) if v[g] > 0
                                          for i in range(len(groups[w]))})
        for s in best.tensors:
            owner[s] = k
        result[k] = best
        stats["by_bytes" if best.certain else "ambiguous"] += 1

    # 3. elimination: an ambiguous call whose alternatives were all carried by
    # certain calls has no alternative left
    certain_owner = {s for c in result.values() if c.certain for s in c.tensors}
    for c in result.values():
        if c.certain:
            continue
        alt = [s for s in c.candidates if s not in c.tensors and s not in certain_owner]
        if not alt and c.confidence > 0:
            c.certain, c.confidence, c.candidates, c.method = True, 1.0, [], "elimination"
            stats["ambiguous"] -= 1
            stats["by_elimination"] += 1
    return result


def _lateness(vec: tuple[int, ...], groups: Mapping[int, list[int]], ws: Sequence[int],
              position: np.ndarray) -> tuple[int, int]:
    """How late the tensors a count vector takes (the earliest of each group)
    were enqueued: (latest position, sum of positions)."""
    pos = [int(position[groups[w][i]]) for g, w in enumerate(ws) for i in range(vec[g])]
    return (max(pos) if pos else 0, sum(pos))


def _take_back(call: _Call, s: int, owner: np.ndarray, weights: np.ndarray,
               sub_dtype: np.ndarray) -> None:
    """A later call names tensor s by its buffer: the ambiguous call that had
    taken it takes another pending candidate of the same size and dtype."""
    if s not in call.tensors:
        return
    swap = [x for x in call.candidates if x not in call.tensors and owner[x] < 0
            and weights[x] == weights[s] and sub_dtype[x] == sub_dtype[s]]
    i = call.tensors.index(s)
    if swap:
        call.tensors[i] = swap[0]
        owner[swap[0]] = call.k
    else:
        del call.tensors[i]
        call.confidence = 0.0
        call.certain = False


def infer(frames: Mapping[int, pd.DataFrame], names: Mapping[int, Sequence[str]], *,
          threshold: int | None = None, world_size: int | None = None,
          budget_s: float = TIME_BUDGET_S) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The lineage table (LINEAGE_COLUMNS) from the records of the ranks in
    `frames` (rank 0 required: its calls and times are the table's), and what
    was found (counts per method, tensors, calls; not_inferred: calls left
    when the `budget_s` seconds of inference ran out)."""
    stats = {"by_buffer": 0, "by_bytes": 0, "by_order": 0, "by_elimination": 0,
             "ambiguous": 0, "unexplained": 0, "not_inferred": 0}
    deadline = time.monotonic() + budget_s
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
    calls0 = calls_by_rank[0]
    rows: list[pd.DataFrame] = []
    fused_id = 0
    per_family: dict[str, Any] = {}
    fam_of_prefix = subs0["prefix"].map(lambda p: FAMILIES.get(p))
    for fam in dict.fromkeys(f for f in fam_of_prefix if f is not None):
        fsel = np.asarray([f is fam for f in fam_of_prefix], dtype=bool)
        subs = subs0.loc[fsel].reset_index(drop=True)
        csel = calls0["op"].astype(str).isin(fam.record_ops).to_numpy(dtype=bool) \
            if len(calls0) else np.zeros(0, dtype=bool)
        calls = calls0.loc[csel].reset_index(drop=True)
        key = list(zip(subs["name"], subs["occurrence"]))
        sub_t = np.full((len(subs), len(ranks)), np.nan)
        sub_bytes_all = np.zeros(len(subs), dtype=np.int64)
        sub_seen = np.zeros(len(subs), dtype=np.int64)
        call_t = np.full((len(calls), len(ranks)), np.nan)
        ckey = list(zip(calls["comm"].to_numpy().tolist(), calls["seq"].to_numpy().tolist()))
        for j, r in enumerate(ranks):
            sr = subs_by_rank[r]
            idx = dict(zip(zip(sr["name"], sr["occurrence"]), range(len(sr))))
            pos = np.asarray([idx.get(kk, -1) for kk in key], dtype=np.int64)
            got = pos >= 0
            sub_t[got, j] = sr["t_start_ns"].to_numpy(dtype=np.float64)[pos[got]]
            sub_bytes_all[got] += sr["bytes"].to_numpy(dtype=np.int64)[pos[got]]
            sub_seen[got] += 1
            cr = calls_by_rank[r]
            if len(cr):
                cidx = dict(zip(zip(cr["comm"].to_numpy().tolist(),
                                    cr["seq"].to_numpy().tolist()), range(len(cr))))
                cpos = np.asarray([cidx.get(kk, -1) for kk in ckey], dtype=np.int64)
                cg = cpos >= 0
                call_t[cg, j] = cr["t_start_ns"].to_numpy(dtype=np.float64)[cpos[cg]]
        weights = subs["bytes"].to_numpy(dtype=np.int64).copy()
        if fam.gathered:
            n = world_size or len(ranks)
            every = sub_seen == n
            weights = np.where(every, sub_bytes_all, weights * n)
        fstats = dict.fromkeys(stats, 0)
        result = _infer_family(fam, subs, calls, sub_t, call_t, weights, fstats, deadline)
        for kk, v in fstats.items():
            stats[kk] += v
        per_family[fam.key] = {"tensors": int(len(subs)), "calls": int(len(calls)),
                               **{kk: v for kk, v in fstats.items() if v}}
        rows.append(_rows(fam, subs, calls, sub_t, result, fused_id, threshold, ranks))
        fused_id += len(calls)
    table = pd.concat(rows, ignore_index=True) if rows else _empty()
    table = table.sort_values(["t_start_ns"], kind="stable").reset_index(drop=True)
    info.update(stats)
    info["families"] = per_family
    info["rows"] = int(len(table))
    info["tensors"] = int(table["tensor"].nunique()) if len(table) else 0
    info["matched_calls"] = int(table.loc[table["matched"], "fused_id"].nunique()) \
        if len(table) else 0
    return table[LINEAGE_COLUMNS], info


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in LINEAGE_COLUMNS})


def _rows(fam: Family, subs: pd.DataFrame, calls: pd.DataFrame, sub_t: np.ndarray,
          result: Mapping[int, _Call], id0: int, threshold: int | None,
          ranks: Sequence[int]) -> pd.DataFrame:
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
    candidates, and wrong (with up to 5 examples)."""
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
                           "missing": 0, "examples": []}
    for key, truth in o.items():
        got = r.get(key)
        if got is None:
            out["missing"] += 1
            continue
        if got == truth and conf.get(key, 1.0) >= 1.0:
            out["equal"] += 1
        elif conf.get(key, 1.0) < 1.0 and truth <= cand.get(key, set()):
            out["ambiguous_ok"] += 1
        else:
            out["wrong"] += 1
            if len(out["examples"]) < 5:
                out["examples"].append({"call": list(key), "records": sorted(got),
                                        "timeline": sorted(truth)})
    out["extra"] = len(set(r) - set(o))
    return out
