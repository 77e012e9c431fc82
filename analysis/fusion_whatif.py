"""Tensor fusion and cycle time what-if: from one run, the data calls and the
communication time per step at other HOROVOD_FUSION_THRESHOLD and
HOROVOD_CYCLE_TIME values.

Inputs: the run's fusion lineage (profiler.formats.lineage: per tensor and
step, its name, bytes, dtype and when it was ready on every rank read,
``ready_ns``), its Horovod allreduces and broadcasts on every rank, and an
alpha-beta model of an allreduce's transfer time (latency_model,
profiler.analysis.model): a `profiler bench` trace's allreduce curve when one
of the same fabric is given; else the run's own data calls, never Horovod's
control calls while there is anything else: its data allreduces when they
come in several sizes (an unfused run), or its start-up broadcasts
(hvd.broadcast_parameters: one MPI_Bcast per tensor, every size the job's
tensors have), twice theirs at 2 ranks, where an allreduce is an exchange
and a broadcast one message.

The simulation replays Horovod 0.28's background loop (operations.cc
RunLoopOnce; controller.cc ComputeResponseList, FuseResponses,
TensorFusionThresholdBytes; response_cache.cc): each cycle begins with the
response-cache allreduce, so the run's own cycles are the starts of the
control allreduces of Horovod's thread on rank 0.  The tensors ready on
every rank by a cycle's start go out in that cycle, tensors sent before in
the order of their cache bits (the order of their first responses), new ones
after them in readiness order; packing is FuseResponses' (see simulate: one
dtype per call, a tensor of another dtype looked past while the bytes allow,
a tensor larger than the threshold alone), against the threshold as Horovod
rounds it (up to a multiple of 512 bytes x the ranks per host).  At the
run's own cycle time its recorded cycles are used; at another cycle time T,
cycles every T plus the run's own overhead per cycle (median gap between its
cycles minus its cycle time), from its first cycle.  Ranks sleep out their
cycles each on its own clock, so at the run's own cycle time a tensor goes in
the first cycle every rank began after holding it (each rank's control
allreduce start against that rank's enqueue, _own_cycles).

Time is transfer time: per call, from the last rank's arrival to the last
rank's return (transfer_times), which the trace measures for every matched
call; the time early ranks wait for late ones is left out.  A predicted call
costs the model at its size, and the run's own figure is the same quantity
summed over its data calls per step (the median step, and the mean).

What the curve does not hold, which the method's error absorbs: the first
data call of a cycle takes longer than its size's (the ranks just woke from
the cycle's sleep); a fused call is cheaper per byte than its tensors sent
apart; on a loaded machine a call's transfer is mostly the wait for both
ranks to be on a core at once, which WhatIf.contention and the latency's
`agreement` detect, and the prediction's error is then the whole figure.
How well it holds, measured: docs/validation.md, "Fusion lineage and
what-if".

The prediction for the run's own settings, against what the run did, gives
the method's error on this job; a setting is recommended only when its
predicted gain exceeds that error.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats.horovod_env import DEFAULT_CYCLE_MS
from profiler.formats.horovod_env import settings as horovod_settings

__all__ = ["simulate", "whatif", "WhatIf", "fusion_threshold_bytes", "transfer_times",
           "latency_model", "Latency",
           "ranks_per_host", "DEFAULT_THRESHOLDS", "DEFAULT_CYCLE_MS"]

MIB = 1 << 20
DEFAULT_THRESHOLDS = (0, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 128 * MIB)
#: horovod/common/common.h: a fused allreduce's size is a multiple of this many elements
FUSION_BUFFER_ATOMIC_UNIT = 64


def fusion_threshold_bytes(threshold: int, local_size: int | None) -> int:
    """The threshold Horovod packs against (controller.cc TensorFusionThresholdBytes):
    on a homogeneous job (every host runs `local_size` ranks) the set value is
    rounded up to a multiple of local_size x 8 bytes x 64 (room for a whole
    number of float64 atomic units per local rank); otherwise as set."""
    if threshold <= 0 or not local_size or local_size < 1:
        return max(0, threshold)
    div = local_size * 8 * FUSION_BUFFER_ATOMIC_UNIT
    return -(-threshold // div) * div


def simulate(ready_ns: np.ndarray, nbytes: np.ndarray, dtype: Sequence[str],
             marks_ns: np.ndarray, latency_ns: Any, *, threshold: int,
             key: Sequence[Hashable] | None = None,
             cycle: np.ndarray | None = None) -> tuple[int, float]:
    """(data calls, transfer ns) of a set of allreduce tensors under a fusion
    threshold (in bytes, as Horovod packs against: fusion_threshold_bytes),
    given the cycle starts `marks_ns`; latency_ns(bytes) -> ns.

    Each tensor goes out in the first cycle that starts at or after it is
    ready (or in cycle `cycle[i]`, an index into marks_ns, when given: the
    cycles as every rank's own clock of them decides, whatif).  The order
    within a cycle is Horovod's: with `key` (the tensor's identity across
    steps, its name) the response cache's, that is tensors
    already sent once first, in the order they were first sent (their cache
    bits, controller.cc: cache hits are taken in ascending bit order, and a
    new response's bit is the next free one), then new tensors in readiness
    order; without `key` (HOROVOD_CACHE_CAPACITY=0) readiness order.  Packing
    is controller.cc FuseResponses: the first tensor left opens a call (alone
    when it is larger than the threshold); each next tensor of its dtype joins
    while the call's bytes stay within the threshold; a tensor of another
    dtype is skipped over (left for a later call) while the call's bytes plus
    those skipped stay within the threshold, and the first tensor that
    neither joins nor can be skipped closes the call; skipped tensors open
    the next calls in their order."""
    n = len(ready_ns)
    if n == 0:
        return 0, 0.0
    ready = np.asarray(ready_ns, dtype=float)
    size = np.asarray(nbytes, dtype=float)
    if cycle is None:
        cycle = np.searchsorted(np.asarray(marks_ns, dtype=float), ready, side="left")
    cycle = np.asarray(cycle, dtype=np.int64)
    by_cycle = np.lexsort((np.arange(n), ready, cycle))
    bits: dict[Hashable, int] = {}
    sizes: list[float] = []
    lo = 0
    cyc = cycle[by_cycle]
    while lo < n:
        hi = int(np.searchsorted(cyc, cyc[lo], side="right"))
        members = by_cycle[lo:hi].tolist()  # readiness order
        lo = hi
        if key is not None:
            hits = sorted((i for i in members if key[i] in bits), key=lambda i: bits[key[i]])
            members = hits + [i for i in members if key[i] not in bits]
        queue = deque(members)
        while queue:
            first = queue.popleft()
            total, dt, fused = size[first], dtype[first], [first]
            skipped: list[int] = []
            skipped_size = 0.0
            while queue:
                nxt = queue[0]
                if dtype[nxt] == dt and total + size[nxt] <= threshold:
                    total += size[nxt]
                    fused.append(queue.popleft())
                    continue
                skipped_size += size[nxt]
                if total + skipped_size > threshold:
                    break
                skipped.append(queue.popleft())
            queue.extendleft(reversed(skipped))
            sizes.append(total)
            if key is not None:
                for i in fused:
                    bits.setdefault(key[i], len(bits))
    return len(sizes), float(np.sum(latency_ns(np.asarray(sizes, dtype=float))))


@dataclass
class WhatIf:
    table: pd.DataFrame              # threshold, cycle_ms, calls/step, transfer ms/step
    actual_calls: float              # the run's own data calls per step
    actual_comm_ms: float            # ... their transfer time per step (mean over steps)
    actual_comm_median_ms: float     # ... the median step's
    actual_wait_ms: float            # ... rank 0's time in them per step, waits included
    base_calls: float                # the prediction at the run's own settings
    base_comm_ms: float              # ... its transfer time
    calls_error: float               # |base - actual| / actual
    comm_error: float                # |base_comm - actual_comm_median| / actual_comm_median
    threshold: int
    cycle_ms: float
    steps: int
    local_size: int | None = None    # ranks per host (None: not homogeneous or unknown)
    basis: str = "transfer"          # "transfer" (every rank read) or "rank0" (with waits)
    latency: Latency | None = None   # what prices the predicted calls (latency_model)
    actual_floor_ms: float = math.nan  # the median step's data calls at their sizes' floor

    @property
    def contention(self) -> float:
        """The run's median step over its floor (its data calls each at the
        FLOOR_PERCENTILE of its size's transfers): 1.2-1.6 in calm runs here,
        25-80 when the machine's load held the ranks off their cores."""
        if not (np.isfinite(self.actual_floor_ms) and self.actual_floor_ms > 0):
            return math.nan
        return self.actual_comm_median_ms / self.actual_floor_ms

    def distrust(self) -> list[str]:
        """Why this run's transfer times cannot price other settings, in
        words ([] when they can): the latency model `wide`, or the run
        contended (contention above CONTENDED)."""
        why = []
        if self.latency is not None and self.latency.wide:
            why.append("the latency's sources disagree or are control calls")
        if self.contention > CONTENDED:
            why.append(f"the run was contended (median step {self.contention:.0f}x its floor)")
        return why

    @property
    def error(self) -> float:
        """The prediction's relative error, as far as one run can tell: the
        largest of its errors on the run itself (calls, transfer time) and the
        latency model's on the sizes it was fitted at; 1 (the whole figure)
        when the model is `wide` (fitted on control calls, or its sources
        disagree) or the run was contended (contention above CONTENDED)."""
        if self.distrust():
            return 1.0
        errs = [e for e in (self.calls_error, self.comm_error,
                            self.latency.error if self.latency is not None else math.nan)
                if np.isfinite(e)]
        return max(errs) if errs else math.nan


def _settings(env: Mapping[str, Any] | None) -> tuple[int, float, int]:
    """Threshold, cycle time and cache capacity as Horovod read them
    (profiler.formats.horovod_env: strtol and strtof, as operations.cc)."""
    s = horovod_settings(env)
    return s.fusion_threshold, s.cycle_time_ms, s.cache_capacity


def ranks_per_host(hosts: Sequence[Any]) -> int | None:
    """Horovod's local size for the threshold's rounding: the ranks per host
    when every host runs the same number (a homogeneous job), else None."""
    counts = pd.Series([str(h) for h in hosts]).value_counts()
    if counts.empty or counts.nunique() != 1:
        return None
    return int(counts.iloc[0])


def transfer_times(rows: pd.DataFrame,
                   ops: str | Sequence[str] = "allreduce") -> pd.DataFrame:
    """Per call of Horovod's thread of `ops` (default its allreduces) matched
    over the ranks read (comm, seq): its bytes and its transfer time, from
    the last rank's arrival to the last rank's return (what the call cost
    once every rank was in it; the time ranks spent waiting for the last one
    is left out).  Columns: comm, seq, op, bytes, comm_size, kind, transfer_ns."""
    from .imbalance import match_calls

    m = match_calls(rows, ops=ops)
    m = m.loc[m["complete"].to_numpy(dtype=bool)]
    out = m[["comm", "seq", "op", "bytes", "comm_size", "kind"]].copy() if "kind" in m.columns \
        else m[["comm", "seq", "op", "bytes", "comm_size"]].assign(kind="")
    out["transfer_ns"] = (m["duration_ns"] - m["spread_ns"]).to_numpy(dtype=float)
    return out.reset_index(drop=True)


#: distinct sizes of the run's own data allreduces enough to fit them alone,
#: each made at least MIN_SIZE_CALLS times (a split call of a stretched step
#: happens once: its one time says more about that moment than its size)
MIN_OWN_SIZES = 4
MIN_SIZE_CALLS = 3
#: the ops whose data calls the latency model may be fitted on
LATENCY_OPS = ("allreduce", "bcast")
#: at 2 ranks, a data allreduce's transfer over a data broadcast's of the
#: same size: an exchange (n bytes each way, then the reduction) against one
#: message of n bytes; measured 1.5-2.2 at every size from 64 bytes to 147 KB
#: (resnet8 runs at threshold 0 here, which make both at the same sizes)
ALLREDUCE_OVER_BCAST = 2.0
#: the run's own data allreduces over the broadcasts' curve so scaled (its
#: fused call at the default threshold: 0.5-1.4 in calm runs here); outside
#: this range the two disagree, the machine's load having slowed one of them
#: (30-85 when the fused calls were held off their cores, 70-120 and once
#: 7000 when the start-up broadcasts were), and the prediction is `wide`
AGREEMENT_RANGE = (1 / 3, 3.0)
#: a run whose median step's transfer is above this many times its floor
#: (its calls at their size's 10th percentile) was contended: its times say
#: more about the machine's load than about the fabric (WhatIf.contention)
CONTENDED = 3.0
#: the percentile of a size's transfers taken as the run's floor
FLOOR_PERCENTILE = 10


@dataclass(frozen=True)
class Latency:
    """The latency model the what-if prices each predicted call with, and
    what it was fitted on (latency_model)."""

    model: Any          # analysis.model.AlphaBetaModel of `source`'s per-size medians
    source: str         # "allreduce", "broadcast", "bench" or "control"
    sizes: int          # distinct sizes fitted
    scale: float = 1.0  # broadcast: the allreduce over the broadcasts' curve
    agreement: float = math.nan  # broadcast: the run's allreduces over the scaled curve
    error: float = 0.0  # median |relative residual| of the fitted per-size medians
    wide: bool = False  # fitted on control calls: not a data transfer's time

    def predict_ns(self, nbytes: Any) -> np.ndarray:
        """The curve at `nbytes`, made subadditive: Horovod's thread runs a
        threshold's calls one after another, so a split buffer is never sent
        faster than the whole one.  A piecewise fit can break that (a region
        with a negative intercept prices its sizes below their halves, and
        every split then looks like a saving), so the cost per byte at n is
        lifted to the most any larger size costs per byte; a curve with
        positive intercepts is left as it is."""
        return _subadditive(self.model, nbytes) * self.scale

    def describe(self) -> str:
        """What the curve was fitted on, in words: the fusion finding and
        `profiler tensors --whatif` both say it."""
        what = {"bench": "the bench's allreduce curve",
                "allreduce": "this run's data allreduces",
                "broadcast": (f"this run's start-up broadcasts, scaled {self.scale:.2f}x to "
                              "its allreduces"),
                "control": "this run's allreduces with Horovod's control calls (no data call "
                           "of another size)"}.get(self.source, self.source)
        return f"{what} ({self.sizes} sizes)"


def _subadditive(model: Any, nbytes: Any) -> np.ndarray:
    """model(n), its cost per byte lifted to sup over m >= n of model(m) / m
    (n > 0; other sizes as the model says): the smallest such curve whose
    cost per byte never falls as sizes grow.  Each region is a line, so its
    cost per byte is monotone and the supremum is at n itself, a region's
    ends (each side of a boundary) or, past the last, that region's slope."""
    x = np.asarray(nbytes, dtype=float)
    raw = np.asarray(model.predict_ns(x), dtype=float)
    regions = getattr(model, "regions", None)
    if not regions:
        return raw
    edges = np.asarray(model.boundaries(), dtype=float)
    pts = np.unique(np.concatenate([edges * (1 - 1e-9), edges * (1 + 1e-9)]))
    pts = pts[pts > 0]
    g = np.asarray(model.predict_ns(pts), dtype=float) / pts
    # the most any point at or past pts[i] costs per byte, the last slope included
    after = np.maximum.accumulate(np.append(g, float(regions[-1].beta_ns_per_byte))[::-1])[::-1]
    pos = x > 0
    safe = np.where(pos, x, 1.0)
    lifted = np.maximum(raw / safe, after[np.searchsorted(pts, safe, side="left")]) * safe
    return np.where(pos, lifted, raw)


def _medians(calls: pd.DataFrame, min_calls: int = 1) -> pd.Series:
    """Per size (bytes > 0): the median transfer, over sizes with min_calls calls."""
    g = calls.groupby("bytes")["transfer_ns"]
    med = g.median()[g.size() >= min_calls]
    return med[(med > 0) & (med.index.to_numpy(dtype=float) > 0)]


def _fit(med: pd.Series) -> tuple[Any, float]:
    from .model import fit_curve

    x = med.index.to_numpy(dtype=float)
    y = med.to_numpy(dtype=float)
    model = fit_curve(x, y)
    rel = y / np.maximum(model.predict_ns(x), 1e-9) - 1.0
    return model, float(np.median(np.abs(rel)))


def latency_model(calls: pd.DataFrame, bench: pd.DataFrame | None = None) -> Latency | None:
    """The latency of one allreduce of n bytes on this job, for the what-if.

    `calls`: Horovod's allreduces and broadcasts of the run (columns op,
    kind, bytes, transfer_ns and comm_size: transfer_times over LATENCY_OPS,
    or one rank's durations); `bench`: the rows of a `profiler bench` trace of the same
    fabric, or None.  In order of preference:

    * "bench": the bench's alpha-beta fit of its allreduces (per-size median
      durations, analysis.model.fit_models): the fabric's own curve, measured
      at every size (`profiler advise TRACE --bench BENCH`);
    * "allreduce": a fit of the run's own data allreduces, when they come in
      at least MIN_OWN_SIZES sizes of MIN_SIZE_CALLS calls or more (an
      unfused or split run: one call per tensor or group, every step);
    * "broadcast": a fit of the run's data broadcasts, scaled to an
      allreduce.  A run at the default threshold makes one allreduce size
      (its fused call), but hvd.broadcast_parameters and
      broadcast_optimizer_state make one MPI_Bcast per tensor at start-up
      (8 bytes to 147 KB for resnet8), on Horovod's thread, in one cycle,
      back to back, the ranks already together: the transfer of a message of
      each size the job's tensors have, between the job's own ranks.  At 2
      ranks a small allreduce is one exchange as a broadcast is one message,
      so the curves have the same shape (a latency and a per-byte cost), but
      the allreduce sends n bytes each way and reduces them: its transfer is
      ALLREDUCE_OVER_BCAST times the broadcast's.  At other communicator
      sizes the factor is not known and is taken from the run's data
      allreduces instead (the median of their transfers over the
      broadcasts' fit at their size).  At 2 ranks the run's allreduces only
      check the curve (`agreement`, their median over it): the fused call is
      the only size a fused run makes and is cheaper per byte than separate
      calls of its tensors, so a curve anchored there prices the unfused
      calls too low.  An agreement outside AGREEMENT_RANGE means that the
      two disagree (load slowed one of them: a start-up broadcast held for a
      scheduler tick, or fused calls held off their cores), and the
      prediction is marked `wide`;
    * "control": neither: every allreduce of Horovod's thread, control ones
      included.  The 8-byte control allreduce (the response cache's bits)
      follows each cycle's sleep and takes far longer from the last arrival
      than a data call of its size, so this model's latency is far too high
      and the prediction is marked `wide` (its gains are not trusted:
      analysis.findings.fusion).  Figures: docs/validation.md.

    None when even the last has fewer than 2 sizes."""
    if bench is not None and len(bench):
        from .model import fit_models, latency_by_size

        stats = latency_by_size(bench, by=["op"], ops="allreduce")
        if len(stats) >= 2:
            model = fit_models(bench, by=["op"], stats=stats).get(("allreduce",))
            if model is not None:
                x = stats["bytes"].to_numpy(dtype=float)
                rel = stats["median_us"].to_numpy(dtype=float) * 1e3 / np.maximum(
                    model.predict_ns(x), 1e-9) - 1.0
                return Latency(model, "bench", len(stats), error=float(np.median(np.abs(rel))))
    op = calls["op"].astype(str).to_numpy()
    data = (calls["kind"].astype(str) == "data").to_numpy(dtype=bool)
    ar = calls.loc[data & (op == "allreduce")]
    own = _medians(ar, MIN_SIZE_CALLS)
    if len(own) >= MIN_OWN_SIZES:
        model, err = _fit(own)
        return Latency(model, "allreduce", len(own), error=err)
    bc = _medians(calls.loc[data & (op == "bcast")])
    if len(bc) >= 2:
        model, err = _fit(bc)
        ratio = ar["transfer_ns"].to_numpy(dtype=float) / np.maximum(
            model.predict_ns(ar["bytes"].to_numpy(dtype=float)), 1e-9)
        ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
        anchored = float(np.median(ratio)) if len(ratio) else math.nan
        n = (pd.to_numeric(calls.loc[data & (op == "bcast"), "comm_size"], errors="coerce")
             if "comm_size" in calls.columns else pd.Series(dtype=float))
        two = len(n) > 0 and bool((n == 2).all())
        scale = ALLREDUCE_OVER_BCAST if two else (anchored if np.isfinite(anchored) else 1.0)
        agreement = anchored / scale
        lo, hi = AGREEMENT_RANGE
        return Latency(model, "broadcast", len(bc), scale=scale, error=err,
                       agreement=agreement,
                       wide=not (np.isfinite(agreement) and lo <= agreement <= hi))
    every = _medians(calls.loc[op == "allreduce"])
    if len(every) < 2:
        return None
    model, err = _fit(every)
    return Latency(model, "control", len(every), error=err, wide=True)


def _rank_marks(hvd: pd.DataFrame) -> dict[int, np.ndarray]:
    """Each rank's cycle starts on its own clock: the starts of Horovod's
    control allreduces matched over the ranks (comm, seq), in rank 0's order.
    Ranks sleep out their cycles each on its own: one rank's cycle may begin
    tens of ms before another's, and a tensor makes a cycle only when it was
    in every rank's queue at that rank's start."""
    ctl = hvd.loc[(hvd["kind"].astype(str) == "control").to_numpy(dtype=bool)]
    if ctl.empty:
        return {}
    piv = ctl.pivot_table(index=["comm", "seq"], columns="rank", values="t_start_ns",
                          aggfunc="min").dropna()
    r0 = min(piv.columns)
    piv = piv.sort_values(r0)
    return {int(r): piv[r].to_numpy(dtype=float) for r in piv.columns}


def _own_cycles(lin: pd.DataFrame, marks: np.ndarray,
                by_rank: Mapping[int, np.ndarray]) -> np.ndarray:
    """The cycle (index into `marks`, rank 0's cycle starts) each tensor went
    in: the first that every rank began after holding it.  A rank's enqueue
    as the lineage tells it: rank 0's (enqueue_ns), the last rank's
    (ready_ns), any other's the earliest over the ranks (ready_ns -
    ready_spread_ns: exact at 2 ranks, a lower bound beyond).  Without
    matched cycles, ready_ns against rank 0's starts."""
    ready = lin["ready_ns"].to_numpy(dtype=float)
    if not by_rank or len(by_rank[min(by_rank)]) != len(marks):
        return np.searchsorted(marks, ready, side="left")

    def col(name: str, default: np.ndarray) -> np.ndarray:
        v = lin[name].to_numpy(dtype=float) if name in lin.columns else default
        return np.where(np.isfinite(v), v, default)

    r0 = min(by_rank)
    enq0 = col("enqueue_ns", ready)
    first = ready - col("ready_spread_ns", np.zeros(len(lin)))
    last = (lin["last_ready_rank"].to_numpy(dtype=np.int64) if "last_ready_rank" in lin.columns
            else np.full(len(lin), -1))
    cyc = np.zeros(len(lin), dtype=np.int64)
    for r, m in by_rank.items():
        held = np.where(last == r, ready, enq0 if r == r0 else first)
        cyc = np.maximum(cyc, np.searchsorted(m, held, side="left"))
    unknown = ~np.isin(last, np.asarray(list(by_rank)))
    cyc[unknown] = np.maximum(cyc[unknown], np.searchsorted(marks, ready[unknown], side="left"))
    return cyc


def whatif(lineage: pd.DataFrame, rows: pd.DataFrame, env: Mapping[str, Any] | None, *,
           thresholds: Sequence[int] = DEFAULT_THRESHOLDS,
           cycle_ms: Sequence[float] | None = None,
           local_size: int | None = None,
           bench: pd.DataFrame | None = None) -> WhatIf | None:
    """The what-if table for one run: `lineage` (its lineage table), `rows`
    (its rows, every rank's or rank 0's: Horovod's allreduces and broadcasts,
    for the latency model and the run's own figures), `env` (its HOROVOD_*
    settings), `local_size` (ranks per host on a homogeneous job: Horovod
    rounds the threshold up to a multiple of local_size x 512 bytes),
    `bench` (the rows of a `profiler bench` trace of the same fabric: its
    allreduce curve prices the calls).  None when the run lacks what it
    needs (no allreduce lineage with readiness, too few sizes to fit).

    Time is transfer time: with more than one rank's rows, each call's time
    from the last rank's arrival to the last return (transfer_times); a
    predicted call costs latency_model's curve at its size (the bench's, the
    run's data allreduces', or its start-up broadcasts' scaled to its
    allreduces; control calls only when there is nothing else, and the
    prediction is then `wide`).  The run's own figure is the same quantity
    summed over its data calls per step.  With rank 0's rows only (basis
    "rank0"), rank 0's call durations, which include its waits for the other
    ranks."""
    from profiler.postjob.classify import is_horovod_row

    if lineage is None or lineage.empty or "ready_ns" not in lineage.columns:
        return None
    lin = lineage[(lineage["op"] == "ALLREDUCE") & lineage["matched"]
                  & (lineage["step"] >= 0)]
    lin = lin[np.isfinite(lin["ready_ns"].to_numpy(dtype=float))]
    if lin.empty:
        return None
    ops = rows["op"].astype(str).to_numpy()
    hvd_all = rows.loc[is_horovod_row(rows) & np.isin(ops, LATENCY_OPS)]
    hvd = hvd_all.loc[(hvd_all["op"].astype(str) == "allreduce").to_numpy(dtype=bool)]
    if len(hvd) == 0:
        return None
    ranks = hvd["rank"].to_numpy() if "rank" in hvd.columns else np.zeros(len(hvd), int)
    rank0 = hvd.loc[ranks == ranks.min()]
    carried = lin.drop_duplicates(["call_comm", "call_seq"])
    basis = "rank0"
    if len(np.unique(ranks)) > 1 and {"comm", "seq", "t_end_ns", "comm_size"} <= set(hvd.columns):
        calls = transfer_times(hvd_all, ops=LATENCY_OPS)
        tt = calls.loc[(calls["op"].astype(str) == "allreduce").to_numpy(dtype=bool)]
        if len(tt):
            basis = "transfer"
    if basis == "transfer":
        per_call = carried[["step", "call_comm", "call_seq"]].merge(
            tt.rename(columns={"comm": "call_comm", "seq": "call_seq"})[
                ["call_comm", "call_seq", "bytes", "transfer_ns"]].astype(
                {"call_comm": carried["call_comm"].dtype}),
            on=["call_comm", "call_seq"], how="left")
        own = per_call.rename(columns={"transfer_ns": "ns"})
    else:
        all_ranks = (hvd_all["rank"].to_numpy() if "rank" in hvd_all.columns
                     else np.zeros(len(hvd_all), int))
        r0 = hvd_all.loc[all_ranks == all_ranks.min()]
        calls = pd.DataFrame({"op": r0["op"].astype(str).to_numpy(),
                              "kind": (r0["kind"].astype(str).to_numpy() if "kind" in r0.columns
                                       else np.full(len(r0), "data")),
                              "bytes": r0["bytes"].to_numpy(dtype=float),
                              "comm_size": (r0["comm_size"].to_numpy() if "comm_size" in r0.columns
                                            else np.full(len(r0), -1)),
                              "transfer_ns": r0["dur_ns"].to_numpy(dtype=float)})
        own = carried[["step", "call_bytes", "call_dur_ns"]].rename(
            columns={"call_dur_ns": "ns", "call_bytes": "bytes"})
    lat = latency_model(calls, bench)
    if lat is None:
        return None
    th0, cyc0, capacity = _settings(env)
    control = rank0.loc[(rank0["kind"].astype(str) == "control").to_numpy(dtype=bool)]
    marks = np.sort(control["t_start_ns"].to_numpy(dtype=float))
    if len(marks) < 2:
        return None
    by_rank = _rank_marks(hvd) if basis == "transfer" else {}
    if by_rank and len(by_rank[min(by_rank)]) >= 2:
        marks = by_rank[min(by_rank)]  # the cycles every rank had
    else:
        by_rank = {}
    gap_ns = float(np.median(np.diff(marks)))
    overhead_ns = max(0.0, gap_ns - cyc0 * 1e6)
    steps = sorted(int(s) for s in lin["step"].unique())
    order = np.lexsort((lin["tensor"].astype(str).to_numpy(),
                        lin["ready_ns"].to_numpy(dtype=float)))
    lin = lin.iloc[order]
    ready = lin["ready_ns"].to_numpy(dtype=float)
    size = lin["tensor_bytes"].to_numpy(dtype=float)
    dts = lin["dtype"].astype(str).tolist()
    names = lin["tensor"].astype(str).tolist()
    own_cycle = _own_cycles(lin, marks, by_rank)
    # the response cache orders a cycle's tensors when it holds them all
    key = names if 0 < len(set(names)) <= capacity else None

    def run(th: int, cyc: float) -> tuple[float, float]:
        m = marks if cyc == cyc0 else np.arange(marks[0], marks[-1] + gap_ns,
                                                cyc * 1e6 + overhead_ns)
        calls, ns = simulate(ready, size, dts, m, lat.predict_ns,
                             threshold=fusion_threshold_bytes(th, local_size), key=key,
                             cycle=own_cycle if cyc == cyc0 else None)
        return calls / len(steps), ns / len(steps) / 1e6

    # the run's own figures: its data calls (those that carried a tensor) per step
    actual_calls = len(carried) / len(steps)
    by_step = (own.groupby("step")["ns"].sum(min_count=1) / 1e6).reindex(steps)
    actual_comm = float(by_step.sum()) / len(steps)
    actual_median = float(by_step.median()) if by_step.notna().any() else math.nan
    floor = own.groupby("bytes")["ns"].transform(
        lambda v: np.nanpercentile(v, FLOOR_PERCENTILE) if v.notna().any() else np.nan)
    floor_by_step = (floor.groupby(own["step"]).sum(min_count=1) / 1e6).reindex(steps)
    actual_floor = (float(floor_by_step.median()) if floor_by_step.notna().any()
                    else math.nan)
    actual_wait = float(carried["call_dur_ns"].sum()) / len(steps) / 1e6
    base_calls, base_comm = run(th0, cyc0)
    cycles = list(cycle_ms) if cycle_ms is not None else sorted({cyc0, 1.0, 5.0})
    out = []
    for cyc in cycles:
        for th in sorted(set(thresholds) | {th0}):
            c, t = run(th, cyc)
            out.append({"threshold": th, "cycle_ms": cyc, "calls_per_step": c,
                        "transfer_ms_per_step": t, "current": th == th0 and cyc == cyc0})
    return WhatIf(
        table=pd.DataFrame(out), actual_calls=actual_calls, actual_comm_ms=actual_comm,
        actual_comm_median_ms=actual_median, actual_wait_ms=actual_wait,
        base_calls=base_calls, base_comm_ms=base_comm,
        calls_error=abs(base_calls - actual_calls) / actual_calls if actual_calls else math.nan,
        comm_error=(abs(base_comm - actual_median) / actual_median
                    if actual_median and np.isfinite(actual_median) else math.nan),
        threshold=th0, cycle_ms=cyc0, steps=len(steps), local_size=local_size, basis=basis,
        latency=lat, actual_floor_ms=actual_floor)
