"""Synthetic N-rank datasets from a real small trace (`profiler synth`).

    profiler synth SRC -o DIR --ranks N [--calls-per-rank M] [--stragglers K] [--seed S]

SRC is a real profile (trace.json, profile directory or a rank's parquet file),
typically a 2-rank run.  DIR receives what a real N-rank job would leave there
after its exit: ranks/rank-RRRRR.parquet + rank-RRRRR.json for every rank
(the row schema, docs/ARCHITECTURE.md section 3) and trace.json (metadata,
dataset index and the bounded event selection of profiler.formats.tracejson).  It serves
the scale tests (64 ranks) and benchmarks (1024 ranks x 100k calls).

The model, in order:

* **Template.**  One source rank's rows (``template_rank``, default 0), sorted
  by start time, split into a prologue (before the first row of a step), a body
  (first to last row that belongs to a step) and an epilogue (after it).  With
  no steps the body is everything between MPI_Init and MPI_Finalize.  Every
  generated rank makes the same calls in the same order: the job's true mix of
  ops, message sizes, dtypes, kinds (data/control), threads and steps.
* **Length.**  Exactly M calls per rank (``--calls-per-rank``, default: the
  template's count; application rows such as step marks come on top, as many
  as the template has per call): the prologue, the body repeated (and cut
  after the M-th call) to fill, the epilogue.  A repetition
  shifts times by the body's period, step numbers by its number of steps, and
  sequence numbers per communicator by the calls the body makes on it, so
  (comm, seq) keeps matching the same call on every rank.
* **Communicators.**  A communicator as large as the source job becomes the
  N-rank world (comm_size N, comm_rank r); a smaller one (size k > 1) is
  replicated per group of k consecutive ranks (ids made distinct per group).
* **Timing.**  Each matched collective k (seq >= 0, more than one rank, host
  row) keeps its template start b_k and duration d_k, with shared per-call
  noise (lognormal, ``duration_sigma``).  Rank r arrives at
  ``b_k + u * jitter * speed_r`` (u uniform in [0, 1), speed_r in [0.5, 1.5]:
  per-rank jitter) and, when it is call k's straggler, ``delay_k`` later; the
  call completes on every rank at ``b_k + d_k * noise_k + 1.5 * jitter +
  delay_k`` (a blocking collective ends after its last arrival).  The extra
  time accumulates: everything after call k (later calls, steps, the other
  threads) is shifted by it, so stragglers slow the steps down as they would.
* **Stragglers.**  K ranks (``--stragglers``, drawn with ``--seed``).  A share
  ``straggler_share`` of the matched calls gets a straggler (one of the K, at
  random) that arrives ``straggler_delay_ns`` x lognormal(0, 0.5) late.  The
  ranks are recorded in trace.json (``horovod_profiler.synthetic.stragglers``)
  and in their rank metadata (``synthetic.straggler``); what they were given,
  per straggler, in ``synthetic.injected`` (`injected`: its delays at the data
  collectives of the steps, in all and per step: the truth a late rank's cost
  is priced against).
* **Arrivals.**  A template with synchronize marks (APP sync and tensor rows:
  Horovod's DistributedOptimizer) tells where each rank arrives: the step
  breakdown reads a rank's arrival as its last tensor handed to Horovod before
  synchronize, else its entry into it.  A rank's marks move with its lateness
  at the data collective they feed (the first of the step at or after them;
  one in flight keeps its own): a straggler late at the collective its last
  gradients ride in hands them over, and enters synchronize, that much later,
  as a real late rank does.  A straggler is then late at a step: only those
  collectives (one per step whose arrival feeds one) get stragglers, not
  Horovod's cycle (control calls) nor the backward pass's earlier reductions,
  so that the steps it slows are the steps it arrives late in.  Every rank is
  checked before it is written (`check_arrivals`): one whose arrivals and
  collectives disagree (late at one, on time at the other) is refused.
* **Clocks.**  Every rank gets a clock offset to rank 0 (``offset_ns``, uniform
  within +-``offset_ns``, in its header, as the hooks measure it) and a bound
  ``offset_err_ns``; its rows carry a residual error uniform within that bound
  (the job axis is corrected with an imperfect estimate).  Hosts hold
  ``ranks_per_host`` ranks each (hostnames ``<template host>-<i>``).

Everything is drawn from ``numpy.random.default_rng`` seeded with (seed, ...):
the same arguments give the same bytes.  Each rank is generated and written on
its own (memory holds one rank at a time), then trace.json is written by
profiler.formats.tracejson from the rank metadata (the rank-0 merge at exit).
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from profiler.errors import (
    CorruptError,
    EmptyProfileError,
    NotATraceError,
    NotFoundError,
    ProfilerError,
    UsageError,
)
from profiler.formats.dataset import schema_columns
from profiler.formats.record import LIFECYCLE_OPS

__all__ = ["SynthConfig", "SynthResult", "synthesize", "read_template", "check_arrivals",
           "DisagreementError", "calls_for_steps", "median_step_ns"]

NON_MATCHED_OPS = tuple(sorted(LIFECYCLE_OPS))  # profiler.formats.record, defined once


@dataclass
class SynthConfig:
    """Parameters of the generator (see the module doc)."""

    ranks: int
    calls_per_rank: int | None = None
    stragglers: int = 2
    seed: int = 0
    straggler_share: float = 0.25
    straggler_delay_ns: int = 50_000
    jitter_ns: int = 2_000
    duration_sigma: float = 0.15
    offset_ns: int = 1_000_000
    offset_err_ns: int = 500
    ranks_per_host: int = 8
    template_rank: int = 0

    def check(self) -> None:
        if self.ranks < 1:
            raise UsageError(None, f"--ranks must be >= 1, got {self.ranks}")
        if self.calls_per_rank is not None and self.calls_per_rank < 1:
            raise UsageError(None, f"--calls-per-rank must be >= 1, got {self.calls_per_rank}")
        if not 0 <= self.stragglers <= self.ranks:
            raise UsageError(None, f"--stragglers must be in [0, {self.ranks}], got "
                                   f"{self.stragglers}")
        if not 0.0 <= self.straggler_share <= 1.0:
            raise UsageError(None, "straggler share must be in [0, 1]")
        for name in ("straggler_delay_ns", "jitter_ns", "offset_ns", "offset_err_ns"):
            if getattr(self, name) < 0:
                raise UsageError(None, f"{name} must be >= 0")
        if self.ranks_per_host < 1:
            raise UsageError(None, "ranks per host must be >= 1")


@dataclass
class SynthResult:
    directory: Path
    trace: Path
    ranks: int
    rows_per_rank: int
    calls: int
    stragglers: list[int]
    dataset_bytes: int
    seconds: float
    source: str
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# template
# ---------------------------------------------------------------------------
@dataclass
class Template:
    table: pa.Table  # one rank's rows, sorted by t_start_ns
    meta: dict[str, Any] | None  # its ranks/rank-R.json, when present
    job_meta: dict[str, Any] | None  # the source trace.json metadata, when present
    world: int  # the source job's world size
    source: str


def _source_files(src: Path) -> tuple[list[Path], dict[str, Any] | None]:
    from profiler.formats.tracejson import read_trace_meta
    from profiler.layout import rank_files

    if not src.exists():
        raise NotFoundError(src, "no such file or directory")
    if src.is_dir():
        if (src / "trace.json").is_file():
            return _source_files(src / "trace.json")
        files = [p for _, p in sorted(rank_files(src, "ranks", "parquet").items())]
        if not files:
            raise EmptyProfileError(src, "no ranks/*.parquet to take a template from")
        return files, None
    if src.suffix == ".parquet":
        return [src], None
    meta = read_trace_meta(src)
    files = [src.parent / f for f in (meta.get("dataset") or {}).get("files", [])]
    gone = [f for f in files if not f.is_file()]
    if not files or gone:
        raise NotATraceError(src, "the trace's parquet dataset is missing: the generator "
                                  "needs the per-rank files")
    return files, meta


def read_template(src: str | os.PathLike[str], template_rank: int = 0) -> Template:
    """The template rank's rows and metadata from a real profile."""
    p = Path(src)
    files, job_meta = _source_files(p)
    stem = f"rank-{template_rank:05d}.parquet"
    chosen = next((f for f in files if f.name == stem), None)
    try:
        if chosen is None and len(files) == 1:
            chosen = files[0]
        if chosen is None:
            raise UsageError(p, f"no rank {template_rank} in the source dataset")
        table = pq.read_table(chosen)
        schema_columns(table.schema)
    except CorruptError as exc:
        raise NotATraceError(chosen, exc.message) from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise NotATraceError(chosen or p, f"unreadable parquet file: {exc}") from None
    need = {"rank", "op", "backend", "t_start_ns", "t_end_ns", "dur_ns", "seq", "comm",
            "comm_size", "comm_rank", "step"}
    missing = sorted(need - set(table.schema.names))
    if missing:
        raise NotATraceError(chosen, f"not a profile dataset (no column {missing[0]})")
    if table.num_rows == 0:
        raise EmptyProfileError(chosen, "the template rank has no rows")
    ranks = pc.unique(table["rank"]).to_pylist()
    if len(ranks) > 1:
        table = table.filter(pc.equal(table["rank"], template_rank))
        if table.num_rows == 0:
            raise UsageError(chosen, f"no rank {template_rank} in {chosen}")
    order = np.argsort(table["t_start_ns"].to_numpy(), kind="stable")
    table = table.take(pa.array(order))
    meta = None
    js = chosen.with_suffix(".json")
    if js.is_file():
        try:
            meta = orjson.loads(js.read_bytes())
        except orjson.JSONDecodeError:
            meta = None
    world = int((job_meta or {}).get("world_size") or 0)
    if not world and meta:
        world = int(meta.get("header", {}).get("world_size", 0))
    if not world:
        world = max(1, int(pc.max(table["comm_size"]).as_py() or 1))
    return Template(table=table, meta=meta, job_meta=job_meta, world=world, source=str(p))


def _strings(col: pa.ChunkedArray) -> np.ndarray:
    """A (dictionary) string column as an object array of str."""
    return np.asarray(col.cast(pa.string()).to_numpy(zero_copy_only=False), dtype=object)


def _data_delays(tmpl: Template, plan: Plan) -> dict[str, int]:
    """Each straggler's delays summed over the data collectives (kind "data"; every
    collective when the template has no kinds): the counterfactual truth of its
    cost, since each delay shifts all that follows.  Control calls are left out as
    the late-rank finding leaves them out (their last arrival is Horovod's cycle
    phase in real jobs, not a rank)."""
    cols = tmpl.table.column_names
    is_data = (np.asarray(tmpl.table.column("kind").to_pandas().astype(str)) == "data"
               if "kind" in cols else np.ones(tmpl.table.num_rows, bool))
    data = is_data[plan.tidx[plan.coll]]
    return {str(r): int(plan.delay[(plan.straggler_of == i) & data].sum())
            for i, r in enumerate(plan.stragglers)}


def injected(plan: Plan) -> dict[str, Any]:
    """What the plan injects, per straggler (trace.json "synthetic.injected"): its
    delays at the data collectives inside steps, in all and per step of the run
    (the truth a late-rank finding's cost is priced against: each delay shifts all
    that follows), the steps and calls they hit, and "model": "arrivals" where
    its arrivals at synchronize move with them (the template has synchronize
    marks), "collectives" where only its collectives do."""
    steps = plan.steps_run
    data = plan.arrivals.data
    inside = plan.step[plan.coll] >= 0
    model = "arrivals" if len(plan.arrivals.gate) else "collectives"
    out: dict[str, Any] = {"steps": steps, "model": model, "by_straggler": {}}
    for i, r in enumerate(plan.stragglers):
        hit = (plan.straggler_of == i) & data & inside
        total = int(plan.delay[hit].sum())
        out["by_straggler"][str(r)] = {
            "delay_ns": total, "delay_ns_per_step": total / steps if steps else None,
            "delayed_calls": int(hit.sum()),
            "late_steps": int(len(np.unique(plan.step[plan.coll][hit])))}
    return out


# ---------------------------------------------------------------------------
# the shared plan: slots (template row x repetition), times, stragglers
# ---------------------------------------------------------------------------
@dataclass
class Plan:
    tidx: np.ndarray  # template row of each slot
    start: np.ndarray  # slot start on the generated axis (before per-rank terms)
    end: np.ndarray
    seq: np.ndarray
    step: np.ndarray
    coll: np.ndarray  # indices of the matched collective slots
    straggler_of: np.ndarray  # per collective slot: straggler index into `stragglers`, -1
    delay: np.ndarray  # per collective slot: the straggler's delay (ns)
    stragglers: list[int]
    speed: np.ndarray  # per rank
    jitter: int
    n_steps: int
    reps: int
    steps_run: int  # steps with a step mark
    arrivals: Arrivals


@dataclass
class Arrivals:
    """The template's arrival marks (APP tensor and sync rows inside steps) and the
    data collectives they feed (see `link_arrivals`).  Indices into the plan's
    slots (``mark``) or into ``Plan.coll`` (``feed*``, ``fly*``, ``gate``; -1: none)."""

    data: np.ndarray  # per collective slot: a data collective
    mark: np.ndarray  # slots of the arrival marks
    mark_sync: np.ndarray  # per mark: a sync row (only its start moves)
    feed0: np.ndarray  # per mark: the data collective its start feeds
    fly0: np.ndarray  # per mark: a data collective in flight at its start
    feed1: np.ndarray  # the same for its end
    fly1: np.ndarray
    step: np.ndarray  # per step with a synchronize that feeds a collective: its number
    gate: np.ndarray  # the collective the step's arrival feeds (index into Plan.coll)
    time: np.ndarray  # the step's arrival on the plan's axis (after the warp)

    @classmethod
    def none(cls, data: np.ndarray | None = None) -> Arrivals:
        e = np.zeros(0, np.int64)
        return cls(data=np.zeros(0, bool) if data is None else data, mark=e,
                   mark_sync=np.zeros(0, bool), feed0=e, fly0=e, feed1=e, fly1=e,
                   step=e, gate=e, time=e)

    @property
    def gates(self) -> np.ndarray:
        """Per collective slot: some step's arrival feeds it."""
        out = np.zeros(len(self.data), bool)
        out[self.gate] = True
        return out


def _split(tmpl: pa.Table) -> tuple[int, int]:
    """[lo, hi): the body rows of the template (rows sorted by start)."""
    step = tmpl["step"].to_numpy()
    n = len(step)
    inside = np.flatnonzero(step >= 0)
    if len(inside):
        return int(inside[0]), int(inside[-1]) + 1
    ops = _strings(tmpl["op"])
    lo = 0
    while lo < n and ops[lo] == "init":
        lo += 1
    hi = n
    while hi > lo and ops[hi - 1] == "finalize":
        hi -= 1
    return (lo, hi) if hi > lo else (0, n)


def _breakdown_arrival(sync_step: np.ndarray, sync_t: np.ndarray, tens_step: np.ndarray,
                       tens_end: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Per step of `steps`, the arrival the way analysis.breakdown reads it: the end
    of the last tensor handed to Horovod before the step's (last) synchronize entry,
    else that entry; -1 where the step has no synchronize."""
    out = np.full(len(steps), -1, np.int64)
    if not len(sync_step) or not len(steps):
        return out
    o = np.lexsort((sync_t, sync_step))
    last = np.r_[sync_step[o][1:] != sync_step[o][:-1], True]
    us, ut = sync_step[o][last], sync_t[o][last]
    i = np.clip(np.searchsorted(us, steps), 0, len(us) - 1)
    has = us[i] == steps
    entry = np.where(has, ut[i], -1)
    j = np.clip(np.searchsorted(steps, tens_step), 0, len(steps) - 1)
    ok = (steps[j] == tens_step) & (entry[j] >= 0) & (tens_end <= entry[j])
    tens_max = np.full(len(steps), -1, np.int64)
    np.maximum.at(tens_max, j[ok], tens_end[ok])
    return np.where(has, np.where(tens_max >= 0, tens_max, entry), -1)


def link_arrivals(ops: np.ndarray, is_app: np.ndarray, tidx: np.ndarray, start: np.ndarray,
                  end: np.ndarray, step: np.ndarray, coll: np.ndarray,
                  data: np.ndarray) -> Arrivals:
    """Which data collective each arrival mark feeds, on the plan's axis before the
    warp: the first data collective of the mark's step that starts at or after it
    (its gradients ride in it), and one in flight at it (a rank still late for that
    one is late here too).  A step's arrival (analysis.breakdown's: the last tensor
    handed over before synchronize, else the synchronize entry) feeds its *gate*:
    the collective the other ranks wait for in synchronize."""
    if not len(coll) or not data.any():
        return Arrivals.none(data)
    op = ops[tidx]
    app = is_app[tidx]
    is_sync = app & (op == "sync") & (step >= 0)
    is_tens = app & (op == "tensor") & (step >= 0)
    if not is_sync.any():
        return Arrivals.none(data)
    dpos = np.flatnonzero(data)
    dpos = dpos[np.argsort(start[coll[dpos]], kind="stable")]
    ds, de, dstep = start[coll[dpos]], end[coll[dpos]], step[coll[dpos]]

    def feed(u: np.ndarray, s: np.ndarray) -> np.ndarray:
        i = np.searchsorted(ds, u, side="left")
        k = np.minimum(i, len(ds) - 1)
        return np.where((i < len(ds)) & (dstep[k] == s), dpos[k], -1)

    def fly(u: np.ndarray) -> np.ndarray:
        j = np.searchsorted(ds, u, side="right") - 1
        k = np.maximum(j, 0)
        return np.where((j >= 0) & (de[k] > u), dpos[k], -1)

    mark = np.flatnonzero(is_sync | is_tens)
    t0, t1, ms = start[mark], np.maximum(end[mark], start[mark]), step[mark]
    steps = np.unique(step[is_sync])
    sy, te = np.flatnonzero(is_sync), np.flatnonzero(is_tens)
    arr = _breakdown_arrival(step[sy], start[sy], step[te], end[te], steps)
    gate = feed(np.maximum(arr, 0), steps)
    keep = (arr >= 0) & (gate >= 0)
    return Arrivals(data=data, mark=mark, mark_sync=is_sync[mark], feed0=feed(t0, ms),
                    fly0=fly(t0), feed1=feed(t1, ms), fly1=fly(t1), step=steps[keep],
                    gate=gate[keep], time=np.zeros(int(keep.sum()), np.int64))


def calls_for_steps(tmpl: Template, steps: int) -> int:
    """The --calls-per-rank that gives about `steps` steps: the template's calls
    before and after its steps, and its steps' calls repeated (a template whose
    start-up is long, such as Horovod's idle cycles before the first step, needs
    more calls than its steps alone)."""
    t = tmpl.table
    lo, hi = _split(t)
    call = _strings(t["backend"]) != "app"
    step = t["step"].to_numpy()[lo:hi]
    n_steps = len(np.unique(step[step >= 0]))
    body = int(call[lo:hi].sum())
    reps = -(-max(int(steps), 1) // max(n_steps, 1))
    return int(call[:lo].sum()) + int(call[hi:].sum()) + reps * max(body, 1)


def median_step_ns(tmpl: Template) -> int:
    """The template's median step (its APP step rows; 0 without steps): what a
    straggler's delay is best sized against, since the template's machine sets it."""
    t = tmpl.table
    st = _strings(t["op"]) == "step"
    if not st.any():
        return 0
    d = t["t_end_ns"].to_numpy()[st] - t["t_start_ns"].to_numpy()[st]
    return int(np.median(d))


def make_plan(tmpl: Template, cfg: SynthConfig) -> Plan:
    t = tmpl.table
    n = t.num_rows
    lo, hi = _split(t)
    nb = hi - lo
    t0 = t["t_start_ns"].to_numpy().astype(np.int64)
    t1 = t["t_end_ns"].to_numpy().astype(np.int64)
    seq = t["seq"].to_numpy().astype(np.int64)
    step = t["step"].to_numpy().astype(np.int64)
    comm = t["comm"].to_numpy().astype(np.uint64)
    csize = t["comm_size"].to_numpy().astype(np.int64)
    ops = _strings(t["op"])
    backend = _strings(t["backend"])
    device = (t["device"].to_numpy(zero_copy_only=False).astype(bool)
              if "device" in t.schema.names else np.zeros(n, bool))
    is_app = backend == "app"
    # slots: prologue, body x reps (cut after the wanted number of calls), epilogue
    is_call = ~is_app
    calls_wanted = cfg.calls_per_rank or int(is_call.sum())
    body_calls = int(is_call[lo:hi].sum())
    fill = calls_wanted - int(is_call[:lo].sum()) - int(is_call[hi:].sum())
    if fill <= 0 or body_calls <= 0:
        upto = int(np.searchsorted(np.cumsum(is_call), calls_wanted)) + 1
        tidx = np.arange(min(upto, n), dtype=np.int64)
        rep = np.zeros(len(tidx), dtype=np.int64)
        reps = 1
    else:
        reps = -(-fill // body_calls)
        body = np.tile(np.arange(lo, hi, dtype=np.int64), reps)
        cut = int(np.searchsorted(np.cumsum(is_call[body]), fill)) + 1
        tidx = np.concatenate([np.arange(lo), body[:cut], np.arange(hi, n)]).astype(np.int64)
        last = (cut - 1) // nb
        rep = np.concatenate([np.zeros(lo, np.int64), np.repeat(np.arange(reps), nb)[:cut],
                              np.full(n - hi, last, np.int64)])
    in_body = (tidx >= lo) & (tidx < hi)
    epi = tidx >= hi
    shifted = in_body | epi
    # period: the body's span plus the mean gap between its rows' starts
    if nb > 0:
        b0, b1 = int(t0[lo:hi].min()), int(t1[lo:hi].max())
        gap = int(np.diff(t0[lo:hi]).mean()) if nb > 1 else 1000
        period = max(1, b1 - b0 + max(gap, 1))
        body_steps = step[lo:hi][step[lo:hi] >= 0]
        s_lo = int(body_steps.min()) if len(body_steps) else 0
        n_steps = int(body_steps.max()) - s_lo + 1 if len(body_steps) else 0
    else:
        period, n_steps = 1, 0
    shift = np.where(shifted, rep, 0)
    start = t0[tidx] + shift * period
    end = np.maximum(t1[tidx], t0[tidx]) + shift * period
    # steps and sequence numbers
    st = step[tidx]
    st = np.where(st >= 0, st + shift * n_steps, st)
    sq = seq[tidx].copy()
    seq_rows = (~is_app[lo:hi]) & (seq[lo:hi] >= 0)
    if seq_rows.any():
        bc = comm[lo:hi][seq_rows]
        bs = seq[lo:hi][seq_rows]
        ucomm, inv = np.unique(bc, return_inverse=True)
        span = np.zeros(len(ucomm), np.int64)
        np.maximum.at(span, inv, bs)
        mins = np.full(len(ucomm), np.iinfo(np.int64).max)
        np.minimum.at(mins, inv, bs)
        span = span - mins + 1
        pos = np.searchsorted(ucomm, comm[tidx])
        pos = np.clip(pos, 0, len(ucomm) - 1)
        known = ucomm[pos] == comm[tidx]
        per = np.where(known, span[pos], 0)
        call_rows = (~is_app[tidx]) & (sq >= 0)
        sq = np.where(call_rows, sq + shift * per, sq)
    step_rows = is_app[tidx] & (ops[tidx] == "step")
    sq = np.where(step_rows & (st >= 0), st, sq)
    # the matched collectives
    matched = ((~is_app[tidx]) & (~device[tidx]) & (sq >= 0) & (csize[tidx] > 1)
               & ~np.isin(ops[tidx], NON_MATCHED_OPS))
    coll = np.flatnonzero(matched)
    kind = _strings(t["kind"]) if "kind" in t.schema.names else None
    data = (kind[tidx[coll]] == "data") if kind is not None else np.ones(len(coll), bool)
    arrivals = link_arrivals(ops, is_app, tidx, start, end, st, coll, data)
    rng = np.random.default_rng([cfg.seed, 0])
    speed = rng.uniform(0.5, 1.5, cfg.ranks)
    k = cfg.stragglers if cfg.ranks > 1 else 0
    stragglers = sorted(int(x) for x in rng.choice(cfg.ranks, size=k, replace=False)) if k \
        else []
    nc = len(coll)
    noise = np.exp(rng.normal(0.0, cfg.duration_sigma, nc)) if cfg.duration_sigma else \
        np.ones(nc)
    has = (rng.random(nc) < cfg.straggler_share) if k else np.zeros(nc, bool)
    if len(arrivals.gate):  # a late rank is late at a step: at the collective its
        has &= arrivals.gates  # arrival feeds (not Horovod's cycle, not the backward pass)
    who = rng.integers(0, max(k, 1), nc)
    delay = np.where(has, np.rint(cfg.straggler_delay_ns * np.exp(rng.normal(0.0, 0.5, nc))),
                     0).astype(np.int64)
    straggler_of = np.where(has, who, -1).astype(np.int64)
    # the warp: every collective's extra time shifts everything that follows its end
    d = np.maximum(end[coll] - start[coll], 1)
    jmax = int(np.ceil(1.5 * cfg.jitter_ns))
    extra = np.rint(d * (noise - 1.0)).astype(np.int64) + jmax + delay
    e_key = start[coll] + d
    order = np.argsort(e_key, kind="stable")
    e_sorted = e_key[order]
    cum = np.cumsum(extra[order])

    def warp(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(e_sorted, x, side="right") - 1
        return x + np.where(i >= 0, cum[np.maximum(i, 0)], 0)

    new_start = warp(start)
    end_key = end.copy()
    end_key[coll] = start[coll] + d
    new_end = np.maximum(warp(end_key), new_start)
    if len(arrivals.step):  # the arrivals on the warped axis: what a rank's are checked against
        a = arrivals
        m = a.mark
        sy, te = m[a.mark_sync], m[~a.mark_sync]
        a.time = _breakdown_arrival(st[sy], new_start[sy], st[te], new_end[te], a.step)
    return Plan(tidx=tidx, start=new_start, end=new_end, seq=sq, step=st, coll=coll,
                straggler_of=straggler_of, delay=delay, stragglers=stragglers, speed=speed,
                jitter=cfg.jitter_ns, n_steps=n_steps, reps=reps,
                steps_run=int(len(np.unique(st[step_rows & (st >= 0)]))), arrivals=arrivals)


# ---------------------------------------------------------------------------
# per rank
# ---------------------------------------------------------------------------
def _comm_map(tmpl: Template, world: int, rank: int
              ) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Template (comm id, size) -> this rank's (id, size, comm rank)."""
    src_world = tmpl.world

    def mapping(ids: np.ndarray, sizes: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out_id = ids.copy()
        out_size = sizes.copy()
        out_rank = np.where(sizes == 1, 0, -1).astype(np.int32)
        big = sizes >= src_world
        out_size[big] = world
        out_rank[big] = rank
        sub = (sizes > 1) & ~big
        if sub.any():
            g = rank // np.maximum(sizes[sub], 1)
            out_id[sub] = ids[sub] ^ (np.uint64(0x9E3779B97F4A7C15) * (g.astype(np.uint64)
                                                                        + np.uint64(1)))
            out_rank[sub] = (rank % sizes[sub]).astype(np.int32)
        return out_id, out_size, out_rank

    return mapping


def _set(table: pa.Table, name: str, values: np.ndarray) -> pa.Table:
    if name not in table.schema.names:
        return table
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), pa.array(values,
                                                                 type=table.schema.field(i).type))


@dataclass
class RankClock:
    offset_ns: int
    offset_err_ns: int
    residual_ns: int


def rank_clock(cfg: SynthConfig, rank: int) -> RankClock:
    if rank == 0:
        return RankClock(0, 0, 0)
    rng = np.random.default_rng([cfg.seed, 2, rank])
    off = int(rng.integers(-cfg.offset_ns, cfg.offset_ns + 1)) if cfg.offset_ns else 0
    err = int(rng.integers(cfg.offset_err_ns // 5, cfg.offset_err_ns + 1)) \
        if cfg.offset_err_ns else 0
    res = int(rng.integers(-err, err + 1)) if err else 0
    return RankClock(off, err, res)


def _move_arrivals(a: Arrivals, late: np.ndarray, t_start: np.ndarray,
                   t_end: np.ndarray) -> None:
    """Move a rank's arrival marks with its lateness at the collectives they feed
    (`late`: per collective slot, its arrival after the plan's start): a rank
    whose gradients reach a collective late handed them over, and entered
    synchronize, that much later.  The synchronize row's end stays: it returns
    when the step's collectives complete, on every rank alike."""
    if not len(a.mark) or not len(late):
        return

    def by(feed: np.ndarray, fly: np.ndarray) -> np.ndarray:
        return np.maximum(np.where(feed >= 0, late[np.maximum(feed, 0)], 0),
                          np.where(fly >= 0, late[np.maximum(fly, 0)], 0))

    m = a.mark
    t_start[m] += by(a.feed0, a.fly0)
    tens = ~a.mark_sync
    t_end[m[tens]] += by(a.feed1, a.fly1)[tens]
    t_end[m] = np.maximum(t_end[m], t_start[m])


def rank_table(tmpl: Template, plan: Plan, cfg: SynthConfig, rank: int, *,
               arrivals: bool = True) -> pa.Table:
    """Rank `rank`'s rows (sorted by start time).  arrivals=False leaves the
    arrival marks where the template has them, whatever the rank's lateness at
    the collectives: a job whose arrivals and collectives disagree, which
    `check_arrivals` refuses."""
    base = tmpl.table.take(pa.array(plan.tidx))
    n = base.num_rows
    clock = rank_clock(cfg, rank)
    rng = np.random.default_rng([cfg.seed, 1, rank])
    t_start = plan.start + clock.residual_ns
    t_end = plan.end + clock.residual_ns
    c = plan.coll
    if len(c):
        arrive = np.rint(rng.random(len(c)) * plan.jitter * plan.speed[rank]).astype(np.int64)
        if plan.stragglers and rank in plan.stragglers:
            mine = plan.straggler_of == plan.stragglers.index(rank)
            arrive = arrive + np.where(mine, plan.delay, 0)
        t_start[c] += arrive
        t_end[c] += rng.integers(0, 64, len(c))
        t_end[c] = np.maximum(t_end[c], t_start[c])
        if arrivals:
            _move_arrivals(plan.arrivals, arrive, t_start, t_end)
    ids, sizes, crank = _comm_map(tmpl, cfg.ranks, rank)(
        base["comm"].to_numpy().astype(np.uint64), base["comm_size"].to_numpy().astype(np.int64))
    cols: dict[str, np.ndarray] = {
        "rank": np.full(n, rank, np.int32),
        "t_start_ns": t_start,
        "t_end_ns": t_end,
        "dur_ns": t_end - t_start,
        "comm": ids,
        "comm_size": sizes.astype(np.int32),
        "comm_rank": crank,
        "seq": plan.seq,
        "step": plan.step.astype(np.int32),
    }
    if "tid" in base.schema.names:
        tid = base["tid"].to_numpy().astype(np.int64)
        cols["tid"] = np.where(tid >= 0, tid + 10 * rank, tid).astype(np.int32)
    for name, values in cols.items():
        base = _set(base, name, values)
    order = np.argsort(t_start, kind="stable")
    if not (order == np.arange(n)).all():
        base = base.take(pa.array(order))
    return base


class DisagreementError(ProfilerError):
    """A generated rank whose arrivals at synchronize and at the collectives they
    feed tell two stories (synth refuses to write it)."""


def arrival_tolerance_ns(cfg: SynthConfig) -> int:
    """How far a rank's lateness at synchronize may differ from its lateness at the
    step's collective: the arrival jitter (a mark in flight of an earlier
    collective keeps that one's jitter), never a straggler's delay."""
    return int(np.ceil(1.5 * cfg.jitter_ns)) + 1


def check_arrivals(tmpl: Template, plan: Plan, cfg: SynthConfig, rank: int,
                   table: pa.Table) -> None:
    """Refuse a generated rank whose arrivals and collectives disagree.

    Read from the rank's rows as analysis.breakdown reads them: per step whose
    arrival feeds a collective, the rank's arrival (its last tensor handed to
    Horovod before synchronize, else its synchronize entry) and its start of that
    collective (by communicator and sequence number).  Each, less the rank's clock
    residual, is compared with the plan's: the rank must be as late at one as at
    the other (within `arrival_tolerance_ns`).  A straggler delayed at the
    collective whose arrival stayed where it was fails this: the late-rank finding
    would read an on-time rank, and the whole-job pass a late one."""
    a = plan.arrivals
    if not len(a.step):
        return
    residual = rank_clock(cfg, rank).residual_ns
    ops = _strings(table["op"])
    app = _strings(table["backend"]) == "app"
    step = table["step"].to_numpy().astype(np.int64)
    t0 = table["t_start_ns"].to_numpy().astype(np.int64)
    t1 = table["t_end_ns"].to_numpy().astype(np.int64)
    sy = app & (ops == "sync")
    te = app & (ops == "tensor")
    arrival = _breakdown_arrival(step[sy], t0[sy], step[te], t1[te], a.step)
    # the gate collectives' rows, by (communicator, sequence number)
    gslot = plan.coll[a.gate]
    src = tmpl.table.take(pa.array(plan.tidx[gslot]))
    gcomm, _, _ = _comm_map(tmpl, cfg.ranks, rank)(
        src["comm"].to_numpy().astype(np.uint64), src["comm_size"].to_numpy().astype(np.int64))
    gseq = plan.seq[gslot]
    host = ~table["device"].to_numpy(zero_copy_only=False).astype(bool) \
        if "device" in table.schema.names else np.ones(table.num_rows, bool)
    calls = np.flatnonzero(~app & host & (table["seq"].to_numpy() >= 0))
    ccomm = table["comm"].to_numpy().astype(np.uint64)[calls]
    cseq = table["seq"].to_numpy().astype(np.int64)[calls]
    pos = np.full(len(gslot), -1, np.int64)
    if len(calls):
        ucomm = np.unique(ccomm)
        gi = np.clip(np.searchsorted(ucomm, gcomm), 0, len(ucomm) - 1)
        span = int(max(cseq.max(), gseq.max())) + 1
        key = np.searchsorted(ucomm, ccomm).astype(np.int64) * span + cseq
        order = np.argsort(key, kind="stable")
        sk = key[order]
        want = gi.astype(np.int64) * span + gseq
        j = np.minimum(np.searchsorted(sk, want), len(sk) - 1)
        hit = (ucomm[gi] == gcomm) & (sk[j] == want)
        pos[hit] = calls[order[j[hit]]]
    gate_start = np.where(pos >= 0, t0[np.maximum(pos, 0)], -1)
    late_arr = arrival - residual - a.time
    late_gate = gate_start - residual - plan.start[gslot]
    bad = (arrival < 0) | (gate_start < 0) | (np.abs(late_arr - late_gate)
                                             > arrival_tolerance_ns(cfg))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DisagreementError(
            None, f"synthetic rank {rank}, step {int(a.step[i])}: it reaches synchronize "
                  f"{int(late_arr[i])} ns after the plan but the collective its gradients "
                  f"ride in {int(late_gate[i])} ns after it ({int(bad.sum())} such steps): "
                  "its arrivals and collectives disagree")


def _host(tmpl: Template, cfg: SynthConfig, rank: int) -> str:
    h = str((tmpl.meta or {}).get("host") or "host")
    return f"{h}-{rank // cfg.ranks_per_host}"


def rank_meta(tmpl: Template, plan: Plan, cfg: SynthConfig, rank: int, table: pa.Table,
              comm_ns: int) -> dict[str, Any]:
    """ranks/rank-R.json of a generated rank (the template's, adapted)."""
    from profiler._version import __version__
    from profiler.formats import record as F

    m: dict[str, Any] = copy.deepcopy(tmpl.meta) if tmpl.meta else {}
    h = dict(m.get("header") or {})
    clock = rank_clock(cfg, rank)
    host = _host(tmpl, cfg, rank)
    pid = int(h.get("pid") or 1000) + 10 * rank
    h.update({"rank": rank, "world_size": cfg.ranks, "local_rank": rank % cfg.ranks_per_host,
              "pid": pid, "offset_ns": clock.offset_ns, "offset_err_ns": clock.offset_err_ns,
              "offset_method": 1 if cfg.ranks > 1 else 0, "hostname": host,
              "dropped_records": 0})
    h.setdefault("state", F.STATE_OPEN | F.STATE_MPI_INIT | F.STATE_FINALIZED | F.STATE_CLOSED)
    h.setdefault("state_names", ["open", "mpi_init", "finalized", "closed"])
    h.setdefault("job_t0_ns", 0)
    h.setdefault("mode", 0)
    comms = []
    mapping = _comm_map(tmpl, cfg.ranks, rank)
    for c in m.get("comms") or []:
        ids, sizes, cr = mapping(np.array([int(c.get("id", 0))], np.uint64),
                                 np.array([int(c.get("size", 1))], np.int64))
        comms.append({**c, "id": int(ids[0]), "size": int(sizes[0]), "rank": int(cr[0])})
    tracks = []
    for t in m.get("tracks") or []:
        tid = int(t.get("tid", -1))
        tracks.append({**t, "tid": tid + 10 * rank if tid >= 0 else tid})
    backend = _strings(table["backend"])
    calls = int((backend != "app").sum())
    is_straggler = rank in plan.stragglers
    m.update({
        "rank": rank, "profiler_version": __version__, "format_version": F.FORMAT_VERSION,
        "header": h, "host": host, "comms": comms, "tracks": tracks, "calls": calls,
        "rows": table.num_rows, "mode": "full", "aggregated_calls": 0, "unsampled_calls": 0,
        "aggregates": None, "problems": [], "parquet": f"rank-{rank:05d}.parquet",
        "totals": {"comm_ns": comm_ns},
        "steps": _step_totals(table),
        "source": {"raw": None, "state": h["state"], "converted_by": "profiler synth",
                   "converted_at": time.time()},
        "synthetic": {"source": tmpl.source, "template_rank": cfg.template_rank,
                      "seed": cfg.seed, "straggler": is_straggler,
                      "residual_offset_ns": clock.residual_ns},
    })
    m.setdefault("env", {})
    m.setdefault("argv", None)
    if rank != 0:
        m["env"] = None
        m["argv"] = None
        m["executable"] = None
    return m


def _step_totals(table: pa.Table) -> dict[str, Any]:
    """The rank's steps block (profiler.postjob.convert.step_totals, as a real
    rank's conversion writes it) from its generated step rows: what the job's
    step time and images/sec in trace.json come from."""
    from profiler.postjob.convert import step_totals

    cols = [c for c in ("op", "step", "seq", "t_start_ns", "t_end_ns", "dur_ns", "count")
            if c in table.schema.names]
    steps = table.select(cols).filter(pc.equal(table["op"].cast(pa.string()), "step"))
    return step_totals(steps.to_pandas())


def _comm_ns(table: pa.Table) -> int:
    """Total duration of the rank's communication calls (host rows, no app rows, no
    init/finalize): what tracejson uses to spot likely stragglers cheaply."""
    backend = _strings(table["backend"])
    ops = _strings(table["op"])
    keep = (backend != "app") & ~np.isin(ops, NON_MATCHED_OPS)
    if "device" in table.schema.names:
        keep &= ~table["device"].to_numpy(zero_copy_only=False).astype(bool)
    return int(table["dur_ns"].to_numpy()[keep].sum())


# ---------------------------------------------------------------------------
# the whole job
# ---------------------------------------------------------------------------
def synthesize(src: str | os.PathLike[str], out: str | os.PathLike[str], cfg: SynthConfig, *,
               force: bool = False, trace_events: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> SynthResult:
    """Generate the N-rank dataset of `cfg` from the real profile `src` into `out`."""
    from profiler.formats.dataset import write_parquet
    from profiler.formats.tracejson import now_iso
    from profiler.postjob.merge import job_metadata
    from profiler.postjob.window import write_trace

    cfg.check()
    began = time.perf_counter()
    tmpl = read_template(src, cfg.template_rank)
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise UsageError(d, "exists and is not a directory")
    if d.exists() and any(d.iterdir()):
        if not force:
            raise UsageError(d, "directory is not empty (use --force to replace it)")
        if (d / "ranks").is_dir():
            shutil.rmtree(d / "ranks")
        for extra in ("trace.json", "raw"):
            q = d / extra
            if q.is_dir():
                shutil.rmtree(q)
            elif q.exists():
                q.unlink()
    (d / "ranks").mkdir(parents=True, exist_ok=True)
    plan = make_plan(tmpl, cfg)
    metas: list[dict[str, Any]] = []
    files: list[Path] = []
    total_bytes = 0
    calls = 0
    for r in range(cfg.ranks):
        table = rank_table(tmpl, plan, cfg, r)
        check_arrivals(tmpl, plan, cfg, r, table)
        pf = d / "ranks" / f"rank-{r:05d}.parquet"
        write_parquet(table, pf)
        total_bytes += pf.stat().st_size
        m = rank_meta(tmpl, plan, cfg, r, table, _comm_ns(table))
        (d / "ranks" / f"rank-{r:05d}.json").write_bytes(
            orjson.dumps(m, option=orjson.OPT_SERIALIZE_NUMPY))
        calls += int(m["calls"])
        metas.append(m)
        files.append(pf)
        if progress is not None:
            progress(r + 1, cfg.ranks)
    trace = d / "trace.json"
    meta = job_metadata(d, trace, metas, cfg.ranks, [], [], calls)
    meta["created"] = now_iso()
    meta["problems"] = []
    meta["synthetic"] = {
        "source": tmpl.source, "template_rank": cfg.template_rank, "seed": cfg.seed,
        "ranks": cfg.ranks, "rows_per_rank": int(len(plan.tidx)),
        "stragglers": plan.stragglers, "straggler_share": cfg.straggler_share,
        "straggler_delay_ns": cfg.straggler_delay_ns, "jitter_ns": cfg.jitter_ns,
        "duration_sigma": cfg.duration_sigma, "offset_ns": cfg.offset_ns,
        "offset_err_ns": cfg.offset_err_ns, "ranks_per_host": cfg.ranks_per_host,
        "body_repetitions": plan.reps, "matched_calls_per_rank": int(len(plan.coll)),
        "delayed_calls": int((plan.straggler_of >= 0).sum()),
        # the truth of a late rank's cost: its delays over the run (each shifts all
        # that follows), and the steps they spread over
        "data_delay_ns_by_straggler": _data_delays(tmpl, plan),
        "injected": injected(plan),
        "steps": int(plan.n_steps) * int(plan.reps),
    }
    write_trace(trace, meta, files, metas, limit=trace_events)
    return SynthResult(directory=d, trace=trace, ranks=cfg.ranks, rows_per_rank=len(plan.tidx),
                       calls=calls, stragglers=plan.stragglers, dataset_bytes=total_bytes,
                       seconds=time.perf_counter() - began, source=tmpl.source)
