"""A running job, watched from its raw files (`profiler watch`).

`Watcher(directory).refresh()` reads what every rank appended to its raw file
since the previous refresh (profiler.formats.rawtail: complete chunks' slots
only, no lock, nothing written) and its summary-mode snapshot (rank-R.agg),
folds the new records into aggregates (their layout: analysis.live_aggregates)
and returns a `snapshot()` (analysis.live_snapshot): a plain dict, the JSON of
`profiler watch --once --format json`.  This module is the fold; the rules
below are both's.

Memory is bounded over any run length: per rank one aggregate per (op, kind,
communicator, size class) with a fixed latency histogram, the steps of the
last `window_s` seconds (at most MAX_RECENT_STEPS), and, job-wide, one total
per refresh of the last `window_s` seconds; never the records themselves.

Rules the snapshot follows:

* calls are records, as trace.json's events count them: every op except the
  per-thread CPU accounting ("cpu") and NCCL's network activity ("nccl_net"),
  which are not calls;
* a step is an op "step" record, its count the images; a rank's and the
  job's step time and images/sec are over the steady steps, by the one
  definition trace.json's metadata and the analysis give
  (profiler.formats.steps: step time the ranks' own step times averaged,
  images/sec a step's images over it); "recent" is over the steps with
  images that ended in the last `window_s` seconds of each rank's steps;
* the slowest rank is the one with the longest mean step time (recent steps
  when there are any), among at least two ranks with steps;
* a call in flight is "stuck" when it has been in flight for at least
  `stuck_factor` times its op's mean duration on that rank and at least
  STUCK_MIN_S seconds (no mean yet: STUCK_MIN_S alone);
* a rank's status: "closed", "finalized", "running", "dead", "unknown" (as
  profiler.formats.raw.writer_state says), or "stalled": running or unknown,
  with a helper thread, whose heartbeat (the header's calibration pair and
  helper CPU time, stored by the helper every 100 ms to 1 s) has not moved for
  `stale_s` seconds.  "dead" and "stalled" ranks are the stopped ones.  On
  another host (its pid cannot be checked, its CLOCK_MONOTONIC is not ours)
  the heartbeat alone decides: "running" when it was stored less than
  `stale_s` seconds ago.  Its age is the time since a refresh saw it move
  or, at the first look (`--once`), the host's wall clock at the heartbeat
  (the header's realtime at start + the monotonic time since) against ours:
  right to within the hosts' clock agreement (NTP: milliseconds).  A header
  without that anchor stays "unknown" until the heartbeat is seen to move;
* the profiler's cost of a rank: call_cost_ns x its records and aggregated
  calls, plus its helper thread's CPU time; its share is that over the rank's
  time since start;
* where a step goes: profiler.analysis.breakdown's rank_breakdown, the same
  rules as `profiler advise`, over steps that every rank with steps has run.
  Every BREAKDOWN_EVERY_S seconds (and once every rank has stopped) a
  refresh splits the newest such steps that are final (at most
  MAX_BREAKDOWN_STEPS: a sample when steps are short), from the step,
  synchronize, tensor and join rows and the MPI/NCCL calls kept since the
  last split; a step is final when each rank's newest record is FINAL_LAG_S
  past its end (any call of the step on another thread is published by then)
  or the rank has stopped.  The view is the mean, over the split steps of the
  last `window_s` seconds, of the ranks' mean per part.  Live, the
  profiler's own hooks are part of compute (their cost is known at exit; the
  view shows the cost separately).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler import layout
from profiler.errors import NotFoundError, ProfilerError
from profiler.formats import record as F
from profiler.formats.buckets import STALE_S, STUCK_FACTOR, WINDOW_S
from profiler.formats.clock import ns_per_tick, ticks_to_job_ns
from profiler.formats.raw import c_string, read_agg, writer_state
from profiler.formats.rawtail import RawTail, TailRead
from profiler.formats.rows import thread_kind_of
from profiler.formats.steps import StepFold
from profiler.postjob.classify import classify, horovod_tracks

from .live_aggregates import (
    _BOUNDS_NS,
    _BYTES,
    _CALLS,
    _KINDS,
    _MAX,
    _NS,
    _NV,
    LATENCY_BOUNDS_S,
    NB,
    SIZE_CLASSES,
    _add,
    size_class_index,
)
from .live_snapshot import SCHEMA, STUCK_MIN_S

__all__ = ["Watcher", "SIZE_CLASSES", "LATENCY_BOUNDS_S", "SCHEMA", "STUCK_MIN_S",
           "size_class_index"]

#: Recent steps kept per rank, at most.
MAX_RECENT_STEPS = 4096
#: Rows kept per rank for the step breakdown until their step is split, at most.
MAX_PENDING_ROWS = 1 << 16
#: Steps split per refresh, at most (the newest final ones).
MAX_BREAKDOWN_STEPS = 16
#: A step is final once every rank's newest record is this far past its end.
FINAL_LAG_S = 0.5
#: Seconds between two splits of steps (each costs tens of ms of pandas).
BREAKDOWN_EVERY_S = 5.0
_NO_COMM = 0xFFFFF
_OP_STEP = F.OP_APP_STEP
_NOT_CALLS = np.array([F.OP_BY_NAME[n] for n in sorted(F.NOT_CALL_RECORDS)], dtype=np.uint16)
# what the step breakdown reads: these app rows, and the MPI/NCCL calls
_BREAKDOWN_APP = np.array([F.OP_BY_NAME[n] for n in ("step", "sync", "tensor", "join")],
                          dtype=np.uint16)
_COMM_OPS = np.array([k for k in F.OPS if F.is_comm_op(F.op_name(k), F.op_backend(k))],
                     dtype=np.uint16)


@dataclass
class _Rank:
    rank: int
    tail: RawTail
    header: dict[str, Any] = field(default_factory=dict)
    comms: np.ndarray = field(default_factory=lambda: np.zeros(0, F.COMM_ENTRY_DTYPE))
    tracks: np.ndarray = field(default_factory=lambda: np.zeros(0, F.TRACK_ENTRY_DTYPE))
    inflight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    stats: dict[tuple[int, int, int, int], np.ndarray] = field(default_factory=dict)
    agg_stats: dict[tuple[int, int, int, int], np.ndarray] = field(default_factory=dict)
    agg_sig: tuple[int, int] | None = None
    agg_overflow: int = 0
    hvd_tracks: set[int] = field(default_factory=set)
    kind_cache: dict[int, int] = field(default_factory=dict)
    fold: StepFold = field(default_factory=StepFold)  # its steps, for the steady rule
    recent: deque[tuple[int, int, int]] = field(
        default_factory=lambda: deque(maxlen=MAX_RECENT_STEPS))  # (t_end job ns, dur, images)
    pending: list[dict[str, np.ndarray]] = field(default_factory=list)  # breakdown rows
    pending_n: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    beat: tuple[int, int] | None = None
    beat_at: float = 0.0  # our time.monotonic() when the heartbeat was stored
    beat_known: bool = False  # beat_at is known (seen to move, or by the wall clock)
    problems: list[str] = field(default_factory=list)
    error: str | None = None


class Watcher:
    """Aggregates of a profile directory's raw files, refreshed incrementally."""

    def __init__(self, directory: str | os.PathLike[str], *, window_s: float = WINDOW_S,
                 stuck_factor: float = STUCK_FACTOR, stale_s: float = STALE_S) -> None:
        p = Path(directory)
        if not p.exists():
            raise NotFoundError(p, "no such directory")
        if not p.is_dir():
            raise NotFoundError(p, "not a directory (expected the profile directory "
                                   "holding raw/)")
        self.directory = p
        self.window_s = float(window_s)
        self.stuck_factor = float(stuck_factor)
        self.stale_s = float(stale_s)
        self.ranks: dict[int, _Rank] = {}
        self.problems: list[str] = []
        self.refreshes = 0
        self.last_refresh_cpu_s = 0.0
        self._history: deque[tuple[float, dict[int, np.ndarray]]] = deque()
        # split steps: (step, end ns, ranks, source, [wall, *parts] in ms)
        self._split: deque[tuple[int, int, int, str, np.ndarray]] = deque()
        self._fresh = False  # rows arrived since the last split
        self._split_at = -math.inf
        self._host = socket.gethostname()

    # -- reading ----------------------------------------------------------
    def refresh(self) -> None:
        """Read what every rank appended since the previous refresh."""
        cpu0 = time.process_time()
        problems: list[str] = []
        files = layout.rank_files(self.directory, layout.RAW_DIR, "hvprof", problems)
        for rank, path in sorted(files.items()):
            st = self.ranks.get(rank)
            if st is None:
                st = self.ranks[rank] = _Rank(rank=rank, tail=RawTail(path))
            try:
                read = st.tail.poll()
            except ProfilerError as exc:
                st.error = exc.message
                continue
            st.error = None
            self._fold(st, read)
            self._fold_agg(st, path)
        self.problems = problems
        now = time.monotonic()
        if self._fresh and (now - self._split_at >= BREAKDOWN_EVERY_S or self._stopping()):
            self._split_steps()
            self._prune()
            self._fresh, self._split_at = False, now
        now = time.monotonic()
        self._history.append((now, self._op_totals()))
        while len(self._history) > 2 and now - self._history[1][0] >= self.window_s:
            self._history.popleft()
        self.refreshes += 1
        self.last_refresh_cpu_s = time.process_time() - cpu0

    def close(self) -> None:
        for st in self.ranks.values():
            st.tail.close()

    def _fold(self, st: _Rank, read: TailRead) -> None:
        h = read.header
        st.header, st.comms, st.tracks, st.inflight = h, read.comms, read.tracks, read.inflight
        st.problems = (st.problems + read.problems)[-8:]
        beat = (int(h.get("cal1_mono_ns") or 0), int(h.get("helper_cpu_ns") or 0))
        if beat != st.beat:
            now = time.monotonic()
            if st.beat is None:  # the first look: when its host's wall clock says
                age = _wall_age_s(h)
                st.beat_at, st.beat_known = now - (age or 0.0), age is not None
            else:  # seen to move since the previous refresh
                st.beat_at, st.beat_known = now, True
            st.beat = beat
        rec = read.records
        if not len(rec):
            return
        rec = rec[~np.isin(rec["op"], _NOT_CALLS)]
        if not len(rec):
            return
        t_end = ticks_to_job_ns(rec["t_end"], h)
        t_start = ticks_to_job_ns(rec["t_start"], h)
        t_end = np.maximum(t_end, t_start)
        dur = (t_end - t_start).astype(np.int64)
        lo, hi = int(t_start.min()), int(t_end.max())
        st.first_ns = lo if st.first_ns is None else min(st.first_ns, lo)
        st.last_ns = hi if st.last_ns is None else max(st.last_ns, hi)
        steps = rec["op"] == _OP_STEP
        if steps.any():
            imgs = rec["count"][steps].astype(np.int64)
            d = dur[steps]
            st.fold.add(rec["seq"][steps], d, imgs)
            order = np.argsort(t_end[steps], kind="stable")
            for e, dd, im in zip(t_end[steps][order].tolist(), d[order].tolist(),
                                 imgs[order].tolist()):
                st.recent.append((e, dd, im))
            while st.recent and st.recent[-1][0] - st.recent[0][0] > self.window_s * 1e9:
                st.recent.popleft()
        kinds = self._kinds(st, rec["op"], rec["dtype"], rec["redop"], rec["track"],
                            rec["root"] == 0)
        self._keep(st, rec, t_start, t_end, kinds)
        comm = rec["comm"].astype(np.int64)
        comm = np.where(comm >= _NO_COMM, _NO_COMM, comm)
        _add(st.stats, rec["op"].astype(np.int64), kinds, comm,
             size_class_index(rec["bytes"]), rec["bytes"].astype(np.float64),
             dur.astype(np.float64), np.searchsorted(_BOUNDS_NS, dur, side="left"))

    def _keep(self, st: _Rank, rec: np.ndarray, t_start: np.ndarray, t_end: np.ndarray,
              kinds: np.ndarray) -> None:
        """The rows the step breakdown reads (breakdown.rank_breakdown's columns),
        kept until their step is split."""
        use = np.isin(rec["op"], _BREAKDOWN_APP) | (
            np.isin(rec["op"], _COMM_OPS) & ((rec["flags"] & F.FLAG_DEVICE) == 0))
        if not use.any():
            return
        r = rec[use]
        ops = r["op"].astype(np.int64)
        tk = np.array([thread_kind_of(int(k), int(m), c_string(c)) for k, m, c in
                       zip(st.tracks["kind"], st.tracks["is_main"], st.tracks["caller"])]
                      + ["other"], dtype=object)
        track = r["track"].astype(np.int64)
        track = np.where((track >= 0) & (track < len(st.tracks)), track, len(st.tracks))
        ci = r["comm"].astype(np.int64)
        ok = (ci >= 0) & (ci < len(st.comms))
        safe = np.where(ok, ci, 0)
        has = len(st.comms) > 0
        st.pending.append({
            "op": ops, "t_start_ns": t_start[use].astype(np.int64),
            "t_end_ns": t_end[use].astype(np.int64), "seq": r["seq"].astype(np.int64),
            "kind": kinds[use].astype(np.int64),
            "comm": np.where(ok, st.comms["id"][safe] if has else 0, 0).astype(np.uint64),
            "comm_size": np.where(ok, st.comms["size"][safe] if has else -1, -1
                                  ).astype(np.int64),
            "thread_kind": tk[track], "flags": r["flags"].astype(np.int64)})
        st.pending_n += len(r)
        self._fresh = True

    def _stopping(self) -> bool:
        """Every rank has stopped writing: split now, the final state."""
        return bool(self.ranks) and all(
            self.status(st)[0] in ("closed", "finalized", "dead", "stalled")
            for st in self.ranks.values())

    @staticmethod
    def _rows(st: _Rank) -> dict[str, np.ndarray]:
        """The rank's pending rows as one set of columns (kept that way)."""
        if len(st.pending) > 1:
            st.pending = [{k: np.concatenate([d[k] for d in st.pending])
                           for k in st.pending[0]}]
        return st.pending[0]

    def _split_steps(self) -> None:
        """Split the newest final steps every rank with steps has run (see the
        module docstring) and keep their parts for the window."""
        from profiler.analysis.breakdown import PARTS, rank_breakdown

        ranks = [st for st in self.ranks.values() if st.fold.steps > 0 and st.header]
        if not ranks or any(not st.pending for st in ranks):
            return
        cols, final = {}, {}
        shared: np.ndarray | None = None
        for st in ranks:
            c = cols[st.rank] = self._rows(st)
            stopped = self.status(st)[0] in ("closed", "finalized", "dead", "stalled")
            horizon = np.inf if stopped else (st.last_ns or 0) - FINAL_LAG_S * 1e9
            sel = np.flatnonzero((c["op"] == _OP_STEP) & (c["t_end_ns"] <= horizon))
            final[st.rank] = sel
            got = np.unique(c["seq"][sel])
            shared = got if shared is None else np.intersect1d(shared, got)
        if shared is None or not len(shared):
            return
        chosen = shared[-MAX_BREAKDOWN_STEPS:]
        frames = []
        for st in ranks:
            c, sel = cols[st.rank], final[st.rank]
            pick = sel[np.isin(c["seq"][sel], chosen)]
            lo, hi = int(c["t_start_ns"][pick].min()), int(c["t_end_ns"][pick].max())
            done = int(c["t_end_ns"][sel[np.isin(c["seq"][sel], shared)]].max())
            t0 = c["t_start_ns"]
            keep = (t0 >= lo) & (t0 < hi)
            frames.append(pd.DataFrame({
                "rank": np.full(int(keep.sum()), st.rank, dtype=np.int64),
                "op": np.array([F.op_name(int(o)) for o in c["op"][keep]], dtype=object),
                "backend": np.array([F.op_backend(int(o)) for o in c["op"][keep]],
                                    dtype=object),
                "t_start_ns": t0[keep], "t_end_ns": c["t_end_ns"][keep],
                "seq": c["seq"][keep],
                "step": np.where(c["op"][keep] == _OP_STEP, c["seq"][keep], -1),
                "kind": np.asarray(_KINDS, dtype=object)[c["kind"][keep]],
                "comm": c["comm"][keep], "comm_size": c["comm_size"][keep],
                "thread_kind": c["thread_kind"][keep], "flags": c["flags"][keep]}))
            rest = t0 >= done  # rows up to the newest split step are done with
            st.pending = [{k: v[rest] for k, v in c.items()}]
            st.pending_n = int(rest.sum())
        bd = rank_breakdown(pd.concat(frames, ignore_index=True),
                            n_ranks=sum(1 for x in self.ranks.values() if x.header))
        bd = bd.loc[bd["step"].isin(chosen) & (bd["source"] != "none")]
        if bd.empty:
            return
        names = ["wall_ms", *[f"{p}_ms" for p in PARTS]]
        g = bd.groupby("step")
        per, ends = g[names].mean(), g["t_end_ns"].max()
        src = g["source"].agg(lambda x: str(x.mode().iat[0]))
        for step in per.index.tolist():
            self._split.append((int(step), int(ends[step]), len(ranks), str(src[step]),
                                per.loc[step].to_numpy(dtype=np.float64)))

    def _prune(self) -> None:
        """Bound what the breakdown keeps: split steps of the window, and rows
        not older than the window (at most MAX_PENDING_ROWS per rank)."""
        newest = max((st.last_ns or 0 for st in self.ranks.values()), default=0)
        cut = newest - self.window_s * 1e9
        while self._split and (self._split[0][1] < cut or len(self._split) > MAX_RECENT_STEPS):
            self._split.popleft()
        for st in self.ranks.values():
            if not st.pending:
                continue
            c = self._rows(st)
            t1 = c["t_end_ns"]
            if st.pending_n > MAX_PENDING_ROWS or (len(t1) and t1.min() < cut):
                idx = np.flatnonzero(t1 >= cut)
                idx = idx[np.argsort(c["t_start_ns"][idx], kind="stable")][-MAX_PENDING_ROWS:]
                st.pending = [{k: v[idx] for k, v in c.items()}]
                st.pending_n = len(idx)

    def breakdown(self) -> dict[str, Any] | None:
        """Where a step goes over the window (see the module docstring), None
        before any step was split."""
        from profiler.analysis.breakdown import LABELS, PARTS

        if not self._split:
            return None
        vals = np.array([v for *_x, v in self._split])
        mean = vals.mean(axis=0)
        wall = float(mean[0])
        srcs = [x[3] for x in self._split]
        return {"steps": len(self._split), "ranks": self._split[-1][2],
                "step_numbers": sorted(x[0] for x in self._split),
                "step_ms": wall, "source": max(set(srcs), key=srcs.count),
                "parts": [{"part": p, "label": LABELS[p], "ms": float(mean[i + 1]),
                           "share": float(mean[i + 1]) / wall if wall > 0 else None}
                          for i, p in enumerate(PARTS)]}

    def _kinds(self, st: _Rank, op: np.ndarray, dtype: np.ndarray, redop: np.ndarray,
               track: np.ndarray, root0: np.ndarray) -> np.ndarray:
        """profiler.postjob.classify's kind of each call, as an index into _KINDS,
        classified once per distinct (op, dtype, redop, track, root is 0)."""
        key = (op.astype(np.int64) << 40) | (dtype.astype(np.int64) << 32) | \
            (redop.astype(np.int64) << 24) | ((track.astype(np.int64) & 0x7FFFFF) << 1) | \
            root0.astype(np.int64)
        uniq, inv = np.unique(key, return_inverse=True)
        todo = [i for i, k in enumerate(uniq.tolist()) if k not in st.kind_cache]
        if todo:
            self._classify(st, uniq, todo)
        out = np.array([st.kind_cache[int(k)] for k in uniq.tolist()], dtype=np.int64)
        return out[inv]

    def _classify(self, st: _Rank, uniq: np.ndarray, todo: list[int]) -> None:
        """Kinds of the keys not classified yet (a new Horovod track found among
        them classifies every key again)."""
        new = uniq[todo]
        u_op = (new >> 40) & 0xFFFF
        u_dt, u_ro = (new >> 32) & 0xFF, (new >> 24) & 0xFF
        u_tr, u_r0 = (new >> 1) & 0x7FFFFF, new & 1
        df = pd.DataFrame({
            "op": [F.op_name(int(o)) for o in u_op],
            "backend": [F.op_backend(int(o)) for o in u_op],
            "dtype": [F.dtype_name(int(d)) for d in u_dt],
            "redop": [F.redop_name(int(r)) for r in u_ro],
            "track": u_tr.astype(np.int64), "root": np.where(u_r0 == 1, 0, -1)})
        found = horovod_tracks(df) - st.hvd_tracks
        if found:
            st.hvd_tracks |= found
            old = list(st.kind_cache)
            st.kind_cache.clear()
            if old:
                self._classify(st, np.unique(np.array(old + new.tolist(), dtype=np.int64)),
                               list(range(len(set(old) | set(new.tolist())))))
                return
        df["thread_kind"] = np.where(df["track"].isin(sorted(st.hvd_tracks)), "horovod",
                                     "other")
        got = classify(df)
        for k, kname in zip(new.tolist(), got.astype(str).tolist()):
            st.kind_cache[int(k)] = _KINDS.index(kname) if kname in _KINDS else 0

    def _fold_agg(self, st: _Rank, raw_path: Path) -> None:
        """The summary-mode snapshot (rank-R.agg), read again when it changed."""
        p = layout.agg_path_for(raw_path)
        try:
            s = os.stat(p)
        except OSError:
            return
        sig = (s.st_mtime_ns, s.st_size)
        if sig == st.agg_sig or not st.header:
            return
        try:
            agg = read_agg(p)
        except ProfilerError as exc:
            st.problems = (st.problems + [exc.message])[-8:]
            return
        st.agg_sig = sig
        st.agg_overflow = int(agg.header["overflow_calls"])
        e = agg.entries
        e = e[~np.isin(e["op"], _NOT_CALLS) & (e["calls"] > 0)]
        st.agg_stats = {}
        if not len(e):
            return
        npt = ns_per_tick(st.header)
        kinds = self._kinds(st, e["op"], e["dtype"], e["redop"], e["track"],
                            np.zeros(len(e), dtype=bool))
        comm = e["comm"].astype(np.int64)
        comm = np.where(comm >= _NO_COMM, _NO_COMM, comm)
        # each agg bucket goes to the watch bucket of its lower bound
        lows = np.array([F.agg_bucket_bounds(b)[0] for b in range(F.AGG_BUCKETS)]) * npt
        to_nb = np.searchsorted(_BOUNDS_NS, lows, side="left")
        for i in range(len(e)):
            key = (int(e["op"][i]), int(kinds[i]), int(comm[i]),
                   int(size_class_index(np.array([e["bytes"][i]]))[0]))
            v = st.agg_stats.get(key)
            if v is None:
                v = st.agg_stats[key] = np.zeros(_NV)
            calls = float(e["calls"][i])
            v[_CALLS] += calls
            v[_BYTES] += calls * float(e["bytes"][i])
            v[_NS] += float(e["sum_ticks"][i]) * npt
            v[_MAX] = max(v[_MAX], float(e["max_ticks"][i]) * npt)
            v[4:] += np.bincount(to_nb, weights=e["hist"][i].astype(np.float64),
                                 minlength=NB)[:NB]

    # -- views --------------------------------------------------------------
    def rank_stats(self, st: _Rank) -> dict[tuple[int, int, int, int], np.ndarray]:
        """(op, kind index, comm index, size class) -> values, records and
        summary-mode aggregates together."""
        if not st.agg_stats:
            return st.stats
        out = {k: v.copy() for k, v in st.stats.items()}
        for k, v in st.agg_stats.items():
            if k in out:
                out[k][:_MAX] += v[:_MAX]
                out[k][_MAX] = max(out[k][_MAX], v[_MAX])
                out[k][4:] += v[4:]
            else:
                out[k] = v.copy()
        return out

    def _op_totals(self) -> dict[int, np.ndarray]:
        tot: dict[int, np.ndarray] = {}
        for st in self.ranks.values():
            for (op, _k, _c, _s), v in self.rank_stats(st).items():
                t = tot.setdefault(op, np.zeros(3))
                t += v[:3]
        return tot

    def comm_size(self, st: _Rank, comm: int) -> int:
        if 0 <= comm < len(st.comms):
            return int(st.comms["size"][comm])
        return 0

    def comm_name(self, st: _Rank, comm: int) -> str:
        if 0 <= comm < len(st.comms):
            return c_string(st.comms["name"][comm])
        return ""

    def status(self, st: _Rank) -> tuple[str, float | None]:
        """The rank's status and its heartbeat's age in seconds (None: unknown)."""
        h = st.header
        if not h:
            return "unknown", None
        ws = writer_state(h)
        age: float | None = None
        if st.beat is not None and st.beat[1] > 0:
            if str(h.get("hostname", "")) == self._host and int(h.get("clock_kind", 0)) in (1, 2):
                age = max(0.0, (time.monotonic_ns() - st.beat[0]) / 1e9)
            elif st.beat_known:
                age = max(0.0, time.monotonic() - st.beat_at)
        if ws in ("running", "unknown") and age is not None:
            if age > self.stale_s:
                return "stalled", age
            return "running", age  # another host's rank: its heartbeat is alive
        return ws, age

    def _rank_now_mono_ns(self, st: _Rank) -> int:
        """The rank's CLOCK_MONOTONIC now: ours on its host, else its last
        calibration plus the time since we saw it change."""
        h = st.header
        if str(h.get("hostname", "")) == self._host:
            return time.monotonic_ns()
        base = int(h.get("cal1_mono_ns") or 0)
        return base + int((time.monotonic() - st.beat_at) * 1e9)

    # -- the snapshot -------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The view of what was folded: a plain dict (analysis.live_snapshot)."""
        from .live_snapshot import snapshot

        return snapshot(self)

    def recent_call_rates(self) -> dict[str, float]:
        """op -> calls per second (all ranks) over the refreshes of the last window."""
        if len(self._history) < 2:
            return {}
        (t0, a), (t1, b) = self._history[0], self._history[-1]
        if t1 <= t0:
            return {}
        return {F.op_name(op): float(v[0] - a.get(op, np.zeros(3))[0]) / (t1 - t0)
                for op, v in b.items()}


def _wall_age_s(h: dict[str, Any]) -> float | None:
    """Seconds since the header's heartbeat (cal1) was stored, by the writer's
    wall clock against ours: its realtime at start plus the monotonic time
    from start to the heartbeat (a difference, so any offset of its
    CLOCK_MONOTONIC, a time namespace or another machine's boot, cancels).
    None without the anchor."""
    rt0 = int(h.get("cal0_realtime_ns") or 0)
    m0, m1 = int(h.get("cal0_mono_ns") or 0), int(h.get("cal1_mono_ns") or 0)
    if rt0 <= 0 or m0 <= 0 or m1 < m0:
        return None
    return max(0.0, (time.time_ns() - (rt0 + (m1 - m0))) / 1e9)
