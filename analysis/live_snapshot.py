"""The watcher's snapshot (`profiler watch --once --format json`): a plain
dict of what analysis.live.Watcher has folded from the raw files -- per rank
its state, steps, calls, time and cost, and job-wide the step figures, the
collectives, the calls in flight and the step breakdown.  The rules it follows
are analysis.live's module doc; the fold (reading and aggregating) stays there.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from profiler.analysis.metrics import bus_factor
from profiler.formats import record as F
from profiler.formats import steps as step_figures
from profiler.formats.clock import ticks_to_mono_ns
from profiler.formats.steps import StepTotals

from .live_aggregates import _BYTES, _CALLS, _KINDS, _MAX, _NS

__all__ = ["snapshot", "SCHEMA", "STUCK_MIN_S"]

SCHEMA = "horovod-profiler.watch/1"
#: A call in flight for less than this is never called stuck.
STUCK_MIN_S = 1.0
# the watcher (analysis.live.Watcher) and its ranks, not imported: live imports this
Watcher = Any
_Rank = Any


def snapshot(w: Watcher) -> dict[str, Any]:
    """The snapshot of what the watcher has folded (Watcher.snapshot; the
    rules in analysis.live's module doc)."""
    ranks_out: list[dict[str, Any]] = []
    coll: dict[str, np.ndarray] = {}  # op -> calls, bytes, ns, bus bytes, max
    in_flight: list[dict[str, Any]] = []
    world = 0
    last_ns = 0
    job_steady: list[StepTotals] = []  # every rank's steady steps
    job_recent: list[StepTotals] = []
    for r in sorted(w.ranks):
        st = w.ranks[r]
        h = st.header
        if not h:
            ranks_out.append({"rank": r, "status": "unreadable", "error": st.error})
            continue
        world = max(world, int(h.get("world_size") or 0))
        stats = w.rank_stats(st)
        ops: dict[str, int] = {}
        kinds: dict[str, int] = {}
        op_ns: dict[int, list[float]] = {}
        comm_ns = 0.0
        calls = 0
        for (op, kind, comm, _sc), v in stats.items():
            name = F.op_name(op)
            ops[name] = ops.get(name, 0) + int(v[_CALLS])
            kinds[_KINDS[kind]] = kinds.get(_KINDS[kind], 0) + int(v[_CALLS])
            calls += int(v[_CALLS])
            acc = op_ns.setdefault(op, [0.0, 0.0])
            acc[0] += v[_CALLS]
            acc[1] += v[_NS]
            backend = F.op_backend(op)
            if F.is_comm_op(name, backend):
                comm_ns += v[_NS]
                c = coll.setdefault(name, np.zeros(5))
                c[0] += v[_CALLS]
                c[1] += v[_BYTES]
                c[2] += v[_NS]
                f = bus_factor(name, w.comm_size(st, comm))
                c[3] += v[_BYTES] * f if f == f else 0.0
                c[4] = max(c[4], v[_MAX])
        status, beat_age = w.status(st)
        if st.last_ns is not None:
            last_ns = max(last_ns, st.last_ns)
        flying = _in_flight(w, st, op_ns)
        in_flight.extend(flying)
        recent = list(st.recent)
        steady = st.fold.totals()
        r_steady = step_figures.window_totals(np.array([d for _e, d, _i in recent], np.int64),
                                              np.array([i for _e, _d, i in recent], np.int64))
        job_steady.append(steady)
        job_recent.append(r_steady)
        recorded = st.tail.records_read + int(h.get("aggregated_calls") or 0)
        cost_ns = float(h.get("call_cost_ns") or 0.0) * recorded + \
            int(h.get("helper_cpu_ns") or 0)
        run_ns = int(h.get("cal1_mono_ns") or 0) - int(h.get("cal0_mono_ns") or 0)
        if str(h.get("hostname", "")) == w._host and status in ("running", "stalled",
                                                                   "unknown"):
            run_ns = time.monotonic_ns() - int(h.get("cal0_mono_ns") or 0)
        ranks_out.append({
            "rank": r, "host": str(h.get("hostname", "")), "pid": int(h.get("pid") or 0),
            "status": status, "stopped": status in ("dead", "stalled"),
            "heartbeat_age_s": beat_age,
            "mode": F.MODES.get(int(h.get("mode") or 0), "full"),
            "steps": st.fold.steps, "timed_steps": st.fold.timed_steps,
            "images": st.fold.images,
            "images_per_sec": _rate(steady),
            "images_per_sec_recent": _rate(r_steady),
            "step_time_s": _seconds(step_figures.step_ms(steady)),
            "step_time_recent_s": (sum(d for _e, d, _i in recent) / len(recent) / 1e9
                                   if recent else None),
            "calls": calls, "ops": dict(sorted(ops.items())),
            "kinds": dict(sorted(kinds.items())),
            "comm_time_s": comm_ns / 1e9,
            "last_record_s": st.last_ns / 1e9 if st.last_ns is not None else None,
            "dropped_records": int(h.get("dropped_records") or 0),
            "not_aggregated_calls": st.agg_overflow,
            "unsampled_calls": int(h.get("unsampled_calls") or 0),
            "in_flight": flying,
            "cost": {"call_cost_ns": float(h.get("call_cost_ns") or 0.0),
                     "recorded_calls": recorded,
                     "helper_cpu_s": int(h.get("helper_cpu_ns") or 0) / 1e9,
                     "cost_s": cost_ns / 1e9,
                     "share": cost_ns / run_ns if run_ns > 0 else None},
            "problems": list(st.problems) + ([st.error] if st.error else []),
        })
    live = [x for x in ranks_out if "steps" in x]
    elapsed = last_ns / 1e9 if last_ns > 0 else None
    collectives = _collectives(coll, elapsed, len(live))
    job = step_figures.job_totals(job_steady)
    cost = [x["cost"]["share"] for x in live if x["cost"]["share"] is not None]
    seen = {x["rank"] for x in ranks_out}
    return {
        "schema": SCHEMA,
        "directory": str(w.directory),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": elapsed,
        "window_s": w.window_s,
        "world_size": world,
        "ranks_seen": len(ranks_out),
        "missing_ranks": [r for r in range(world) if r not in seen],
        "finished": bool(live) and len(live) >= world and all(
            x["status"] in ("closed", "dead") for x in live),
        "job": {
            "steps": max((x["steps"] for x in live), default=0),
            "images": sum(x["images"] for x in live),
            "step_ms": _finite(step_figures.step_ms(job)),
            "images_per_sec": _rate(job),
            "images_per_sec_recent": _rate(step_figures.job_totals(job_recent)),
            "calls": sum(x["calls"] for x in live),
            "dropped_records": sum(x["dropped_records"] for x in live),
            "not_aggregated_calls": sum(x["not_aggregated_calls"] for x in live),
            "slowest_rank": _slowest(live),
            "stopped_ranks": [x["rank"] for x in live if x["stopped"]],
            "stuck_calls": sum(1 for f in in_flight if f["stuck"]),
            "profiler_cost_share_max": max(cost) if cost else None,
            "profiler_helper_cpu_s": sum(x["cost"]["helper_cpu_s"] for x in live),
        },
        "breakdown": w.breakdown(),
        "collectives": collectives,
        "in_flight": sorted(in_flight, key=lambda f: -(f["age_s"] or 0.0)),
        "ranks": ranks_out,
        "watcher": {"refreshes": w.refreshes,
                    "last_refresh_cpu_s": w.last_refresh_cpu_s,
                    "open_chunks": sum(st.tail.open_chunks for st in w.ranks.values()),
                    "aggregates": sum(len(st.stats) for st in w.ranks.values())},
        "problems": list(w.problems),
    }

def _in_flight(w: Watcher, st: _Rank, op_ns: dict[int, list[float]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not len(st.inflight):
        return out
    h = st.header
    now = w._rank_now_mono_ns(st)
    handles = {int(c["handle"]): i for i, c in enumerate(st.comms)}
    starts = ticks_to_mono_ns(st.inflight["t_start"], h)
    for e, t0 in zip(st.inflight, starts.tolist()):
        op = int(e["op"])
        age = max(0.0, (now - int(t0)) / 1e9)
        calls, ns = op_ns.get(op, [0.0, 0.0])
        usual = ns / calls / 1e9 if calls else None
        limit = max(STUCK_MIN_S, w.stuck_factor * usual if usual else 0.0)
        ci = handles.get(int(e["comm"]))
        item: dict[str, Any] = {
            "rank": st.rank, "track": int(e["track"]), "op": F.op_name(op),
            "comm": w.comm_name(st, ci) if ci is not None else "",
            "comm_size": w.comm_size(st, ci) if ci is not None else None,
            "age_s": age, "usual_s": usual, "stuck": age >= limit}
        if F.op_name(op) in F.P2P_OPS:
            item.update(peer=int(e["peer"]), tag=int(e["tag"]))
        out.append(item)
    return out

def _collectives(coll: dict[str, np.ndarray], elapsed: float | None,
                 n_ranks: int) -> list[dict[str, Any]]:
    total_ns = sum(float(v[2]) for v in coll.values()) or 1.0
    out: list[dict[str, Any]] = []
    for name, v in coll.items():
        calls, nbytes, ns, bus, mx = (float(x) for x in v)
        out.append({
            "op": name, "calls": int(calls), "bytes": int(nbytes),
            "mean_bytes": nbytes / calls if calls else None,
            "time_s": ns / 1e9, "share": ns / total_ns,
            "mean_us": ns / calls / 1e3 if calls else None, "max_us": mx / 1e3,
            "calls_per_s": (calls / max(n_ranks, 1) / elapsed
                            if elapsed and elapsed > 0 else None),
            "algbw_gbps": nbytes / ns if ns > 0 else None,
            "busbw_gbps": bus / ns if ns > 0 and bus > 0 else None,
        })
    out.sort(key=lambda c: -float(c["time_s"]))
    return out


def _rate(t: StepTotals) -> float | None:
    """Images/sec of these steps (None without images or time)."""
    return _finite(step_figures.images_per_s(t)) if t.images > 0 else None


def _seconds(ms: float) -> float | None:
    """ms as seconds, None for nan."""
    return ms / 1e3 if math.isfinite(ms) else None


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _slowest(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    timed: list[tuple[float, int]] = []
    for x in ranks:
        t = x.get("step_time_recent_s") or x.get("step_time_s")
        if t:
            timed.append((float(t), int(x["rank"])))
    if len(timed) < 2:
        return None
    t, r = max(timed)
    median = float(np.median([t_ for t_, _ in timed]))
    return {"rank": r, "step_time_s": t, "median_step_time_s": median,
            "ratio": t / median if median > 0 else None}
