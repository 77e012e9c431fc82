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

This module holds the inference (per family, per cycle); its parts:
fusion_evidence (the families, the tensors and calls, Horovod's cycles),
fusion_subsets (the subset search), fusion_rows (the lineage table's rows)
and fusion_timeline (the join with Horovod's timeline, and the check).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats.lineage import LINEAGE_COLUMNS
from profiler.postjob.fusion_evidence import (
    _CALL_DTYPES,
    ADASUM,
    ADASUM_BYTES_PER_TENSOR,
    EVIDENCE_COLUMNS,
    FAMILIES,
    MAX_RANKS,
    Family,
    _ambiguous,
    _Call,
    _data_calls,
    _Evidence,
    _families,
    _family_evidence,
    _tensor_rows,
    cycles,
    evidence,
)
from profiler.postjob.fusion_rows import _bare_rows, _empty, _rows, bare
from profiler.postjob.fusion_subsets import Subsets, solve_subset
from profiler.postjob.fusion_timeline import compare, with_timeline

__all__ = ["FAMILIES", "infer", "solve_subset", "compare", "with_timeline", "MAX_RANKS",
           "EVIDENCE_COLUMNS", "evidence", "cycles", "bare", "TIME_BUDGET_S"]

#: Seconds of inference per merge, which runs in rank 0's exit.  Each cycle
#: looks at the open tensors only (about a step's: docs/validation.md has the figures).
#: Beyond the budget the remaining calls are not inferred, and the lineage
#: says so (the first calls of a run show its packing: it repeats per step).
TIME_BUDGET_S = 30.0

# --------------------------------------------------------------------------
# inference
# --------------------------------------------------------------------------

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


