"""CPU contention measured directly (hooks/cpu.c): raw/rank-R.cpu.json -> the
rank's ``cpu`` metadata block (``ranks[i]["cpu"]`` in trace.json).

The sidecar holds what the library read from the kernel: the host's online
CPUs, this process's affinity, the load averages at start and at the end, the
measured cost of one schedstat read, OMP_NUM_THREADS at start, and every
thread of /proc/self/task with its figures at start (the raw file's open:
MPI_Init) and at the end (MPI_Finalize, refreshed at process exit; a thread
keeps its last successful read).  :func:`rank_doc` turns it into the block:

    {"host_cpus": int, "affinity": [cpu, ...], "loadavg_start": [1, 5, 15 min],
     "loadavg_end": [...] | None, "read_cost_ns": int | None (median of 9 reads
     of an open descriptor at start), "schedstat": bool, "step_reads": bool
     (rows were read at steps: schedstat, and not HOROVOD_PROFILE_CPU=0;
     files written before it was stated: schedstat), "step_first",
     "step_every": int | None (which steps were read: every one of the first
     step_first, then one in step_every; 0: none; None: every step, in files
     written before steps were sampled), "reason": str (why
     not, "" when readable), "state": "start" | "finalize" | "exit" (the last
     time the library wrote it: "start" means the rank died before
     MPI_Finalize), "torch_threads": None (the rank's own exit adds it),
     "omp_num_threads": str | None, "rows": APP_CPU rows in the rank's
     dataset, "steps" (step records seen), "steps_read" (those that read
     the threads: None in older files, where it is steps), "step_read_cpu_ns" (the
     stepping thread's CPU time spent reading and recording them, over all
     steps, on its thread clock: timed on one read in 16), "threads_gone"
     (thread tracks whose read failed: exited),
     "threads_omitted" (threads past the sidecar's capacity),
     "threads": [{"tid", "name" (/proc comm), "kind", "track" (index of its
     track, None when it recorded nothing), "start": {"cpu_ns", "wait_ns",
     "slices", "nvcsw", "nivcsw", "t_ns"} | None (not alive at start),
     "end": {...} | None}],
     "clk_tck": int | None (the kernel's clock ticks per second),
     "host": {"reason": str, "boot_id": str (the kernel's; "" unknown),
              "start": HOST | None, "end": HOST | None,
              "procs": [PROC]} | None (files from before the host was read),
     "cgroup": CGROUP | None (files from before cgroups were read)}

CGROUP (hooks/cpu_cgroup.c; docs/CPU_CONTENTION.md): {"version": 1 | 2 | 0,
"path", "limit_path" (the level whose quota is the tightest, "" without
one), "quota_us", "period_us" (None without a quota), "quota_cpus" (quota /
period), "cpuset" (the kernel's list), "cpuset_cpus" ([cpu, ...] or None),
"cpuset_path" (the cpuset's cgroup: on v1 the cpuset controller's own),
"reason", "start", "end": {"nr_periods", "nr_throttled", "throttled_ns",
"t_ns"} | None, "steps": [[step, t_ns, nr_periods, nr_throttled,
throttled_ns], ...] (running totals at the read steps' ends)}.

cpu_ns / wait_ns / slices: the kernel's schedstat (ns on a CPU, ns waiting on
a run queue, timeslices); nvcsw / nivcsw: voluntary and involuntary context
switches (/proc/.../status); last_cpu: the CPU it last ran on (None:
unknown); t_ns: when it was read, on the job axis (the rows' time axis).

The host around the rank (the noisy neighbour), read at the same two
moments: HOST = {"t_ns", "scan_ns", "scan_cpu_ns" (the reading's cost, wall
and the reading thread's CPU time: /proc/stat and the scan of /proc; None in
files without it), "procs_seen", "procs_unreadable", "procs_omitted" (past the
library's 4096), "cpus": [{"cpu", "busy", "idle", "steal"}] (clock ticks;
busy = user + nice + system + irq + softirq)}; PROC = {"pid", "ppid", "name",
"cpu" (last CPU), "start", "end" (utime + stime ticks at the two readings;
None: not there), "own" (this rank's process)}, the library's 512 busiest
over the run.  :func:`trace_block` is the rank's block as trace.json carries
it (the readings' costs, not the lists); :func:`host_view` the per-host view
the merge writes as trace.json's ``cpu_hosts``.

Thread kinds: "main" (tid = pid), "horovod" (the thread whose track Horovod's
library opened: rows' thread_kind "horovod"), "helper" (the library's flush
thread, hvprof-io, and its tcp_info sampler, hvprof-net), "watchdog" (the
hang watchdog, hvprof-watchdog), "other" (torch's and OpenMP's workers, the
application's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from profiler.formats.clock import ticks_to_job_ns
from profiler.layout import cpu_path

HELPER_NAME = "hvprof-io"
#: the library's tcp_info sampler (hooks/mpit.c): the profiler's own, as the helper
NET_NAME = "hvprof-net"
WATCHDOG_NAME = "hvprof-watchdog"
THREAD_KINDS = ("main", "horovod", "helper", "watchdog", "other")
_VALUE_KEYS = ("cpu_ns", "wait_ns", "slices", "nvcsw", "nivcsw")


def read_cpu(raw_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """raw/rank-R.cpu.json as the library wrote it, or None (absent, unreadable)."""
    try:
        doc = orjson.loads(cpu_path(raw_path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _nums(v: Any, n: int) -> list[float] | None:
    if (isinstance(v, list) and len(v) == n
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
        return [float(x) for x in v]
    return None


def _values(v: Any, header: Mapping[str, Any]) -> dict[str, int | None] | None:
    """A thread's figures, its read time moved to the job axis; None when malformed."""
    if not isinstance(v, dict):
        return None
    out: dict[str, int | None] = {}
    for k in _VALUE_KEYS:
        x = _int(v.get(k))
        if x is None or x < 0:
            return None
        out[k] = x
    out["t_ns"] = _job_ns(_int(v.get("ticks")), header)
    last = _int(v.get("last_cpu"))
    out["last_cpu"] = last if last is not None and last >= 0 else None
    return out


def _job_ns(ticks: int | None, header: Mapping[str, Any]) -> int | None:
    if ticks is None or ticks <= 0:
        return None
    try:
        return int(ticks_to_job_ns(np.array([ticks], dtype=np.int64), header)[0])
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def thread_kind(tid: int, name: str, pid: int | None, helper_tid: int | None,
                horovod_tids: set[int]) -> str:
    """One of THREAD_KINDS (module doc)."""
    if pid is not None and tid == pid:
        return "main"
    if name in (HELPER_NAME, NET_NAME) or (helper_tid and tid == helper_tid):
        return "helper"
    if name == WATCHDOG_NAME:
        return "watchdog"
    if tid in horovod_tids:
        return "horovod"
    return "other"


def rank_doc(raw_path: str | os.PathLike[str], header: Mapping[str, Any],
             tracks: Sequence[Mapping[str, Any]], *, rows: int = 0) -> dict[str, Any] | None:
    """The rank's ``cpu`` block (module doc) from its sidecar, the raw header
    (time axis, pid) and its track table (profiler.formats.rows.track_table);
    rows: the rank's APP_CPU rows.  None when there is neither a sidecar nor a
    row (a profile written before CPU figures existed)."""
    doc = read_cpu(raw_path)
    if doc is None:
        if not rows:
            return None
        doc = {"schedstat": None, "reason": f"no {cpu_path(raw_path).name} beside the raw file"}
    pid = _int(doc.get("pid")) or _int(header.get("pid"))
    helper = _int(doc.get("helper_tid"))
    thread_tracks = [t for t in tracks if t.get("kind") == "thread" and _int(t.get("tid"))]
    track_of = {int(t["tid"]): int(t["index"]) for t in thread_tracks}
    horovod = {int(t["tid"]) for t in thread_tracks if t.get("thread_kind") == "horovod"}
    threads: list[dict[str, Any]] = []
    raw_threads = doc.get("threads")
    for t in raw_threads if isinstance(raw_threads, list) else []:
        tid = _int(t.get("tid")) if isinstance(t, dict) else None
        if tid is None:
            continue
        name = t.get("name") if isinstance(t.get("name"), str) else ""
        threads.append({
            "tid": tid, "name": name,
            "kind": thread_kind(tid, name, pid, helper, horovod),
            "track": track_of.get(tid),
            "start": _values(t.get("start"), header),
            "end": _values(t.get("end"), header),
        })
    affinity = doc.get("affinity")
    omp = doc.get("omp_num_threads")
    schedstat = doc.get("schedstat")
    return {
        "host_cpus": _int(doc.get("host_cpus")),
        "affinity": sorted({int(c) for c in affinity if _int(c) is not None})
        if isinstance(affinity, list) else None,
        "loadavg_start": _nums(doc.get("loadavg_start"), 3),
        "loadavg_end": _nums(doc.get("loadavg_end"), 3),
        "read_cost_ns": (lambda c: c if c is not None and c >= 0 else None)(
            _int(doc.get("read_cost_ns"))),
        "schedstat": schedstat if isinstance(schedstat, bool) else None,
        "step_reads": (doc.get("step_reads") if isinstance(doc.get("step_reads"), bool)
                       else schedstat if isinstance(schedstat, bool) else None),
        "step_first": _int(doc.get("step_first")),
        "step_every": _int(doc.get("step_every")),
        "reason": doc.get("reason") if isinstance(doc.get("reason"), str) else "",
        "state": doc.get("state") if isinstance(doc.get("state"), str) else None,
        "torch_threads": None,
        "omp_num_threads": omp if isinstance(omp, str) else None,
        "rows": int(rows),
        "steps": _int(doc.get("steps")),
        "steps_read": _int(doc.get("steps_read")),
        "step_read_cpu_ns": _int(doc.get("step_read_cpu_ns")),
        "threads_gone": _int(doc.get("threads_gone")),
        "threads_omitted": _int(doc.get("threads_omitted")),
        "threads": threads,
        "clk_tck": (lambda t: t if t is not None and t > 0 else None)(_int(doc.get("clk_tck"))),
        "host": _host(doc.get("host"), header),
        "cgroup": _cgroup(doc.get("cgroup"), header),
    }


def cpu_list(text: str) -> list[int] | None:
    """The kernel's CPU list ("0-3,8,10-11") as CPUs; None when malformed."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        a, b = int(lo), int(hi or lo)
        if b < a or b - a > 65536:
            return None
        out.update(range(a, b + 1))
    return sorted(out)


def _cg_stat(v: Any, header: Mapping[str, Any]) -> dict[str, int | None] | None:
    if not isinstance(v, dict):
        return None
    vals = {k: _int(v.get(k)) for k in ("nr_periods", "nr_throttled", "throttled_ns")}
    if any(x is None or x < 0 for x in vals.values()):
        return None
    return {**vals, "t_ns": _job_ns(_int(v.get("ticks")), header)}


def _cgroup(v: Any, header: Mapping[str, Any]) -> dict[str, Any] | None:
    """The rank's cgroup (CGROUP in the module doc); None in files without it."""
    if not isinstance(v, dict):
        return None
    quota, period = _int(v.get("quota_us")), _int(v.get("period_us"))
    limited = quota is not None and period is not None and quota > 0 and period > 0
    cpuset = v.get("cpuset") if isinstance(v.get("cpuset"), str) else ""
    steps = []
    listed = v.get("steps")
    for m in listed if isinstance(listed, list) else []:
        if (isinstance(m, list) and len(m) == 5 and all(_int(x) is not None for x in m)
                and min(m) >= 0):
            steps.append([int(m[0]), _job_ns(int(m[1]), header), int(m[2]), int(m[3]),
                          int(m[4])])
    return {
        "version": _int(v.get("version")) or 0,
        "path": v.get("path") if isinstance(v.get("path"), str) else "",
        "limit_path": v.get("limit_path") if isinstance(v.get("limit_path"), str) else "",
        "quota_us": quota if limited else None,
        "period_us": period if limited else None,
        "quota_cpus": (quota / period) if limited and quota and period else None,
        "cpuset": cpuset, "cpuset_cpus": cpu_list(cpuset) if cpuset else None,
        "cpuset_path": (v.get("cpuset_path") if isinstance(v.get("cpuset_path"), str)
                        else ""),
        "reason": v.get("reason") if isinstance(v.get("reason"), str) else "",
        "start": _cg_stat(v.get("start"), header), "end": _cg_stat(v.get("end"), header),
        "steps": steps,
    }


def _reading(v: Any, header: Mapping[str, Any]) -> dict[str, Any] | None:
    """One host reading of the sidecar (module doc's HOST); None when absent."""
    if not isinstance(v, dict):
        return None
    cpus: list[dict[str, int]] = []
    listed = v.get("cpus")
    for c in listed if isinstance(listed, list) else []:
        if (isinstance(c, list) and len(c) == 4 and all(_int(x) is not None for x in c)
                and min(c) >= 0):
            cpus.append({"cpu": int(c[0]), "busy": int(c[1]), "idle": int(c[2]),
                         "steal": int(c[3])})
    out: dict[str, Any] = {"t_ns": _job_ns(_int(v.get("ticks")), header)}
    for k in ("scan_ns", "scan_cpu_ns", "procs_seen", "procs_unreadable", "procs_omitted"):
        out[k] = _int(v.get(k))
    out["cpus"] = cpus
    return out


def _host(v: Any, header: Mapping[str, Any]) -> dict[str, Any] | None:
    if not isinstance(v, dict):
        return None
    procs = []
    listed = v.get("procs")
    for p in listed if isinstance(listed, list) else []:
        pid = _int(p.get("pid")) if isinstance(p, dict) else None
        if pid is None:
            continue
        start, end = _int(p.get("start")), _int(p.get("end"))
        procs.append({"pid": pid, "ppid": _int(p.get("ppid")),
                      "name": p.get("name") if isinstance(p.get("name"), str) else "",
                      "cpu": (lambda c: c if c is not None and c >= 0 else None)(
                          _int(p.get("cpu"))),
                      "start": start, "end": end, "own": p.get("own") is True})
    boot = v.get("boot_id")
    return {"reason": v.get("reason") if isinstance(v.get("reason"), str) else "",
            "boot_id": boot if isinstance(boot, str) and len(boot) <= 64 else "",
            "start": _reading(v.get("start"), header), "end": _reading(v.get("end"), header),
            "procs": procs}


def trace_block(cpu: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The rank's ``cpu`` block as trace.json carries it: the host readings
    without their CPU and process lists (those are in ``cpu_hosts``)."""
    if not isinstance(cpu, Mapping):
        return None
    out = dict(cpu)
    host = cpu.get("host")
    if isinstance(host, Mapping):
        out["host"] = {"reason": host.get("reason", ""), "boot_id": host.get("boot_id", ""), **{
            k: ({kk: vv for kk, vv in r.items() if kk != "cpus"}
                if isinstance(r, Mapping) else None)
            for k, r in ((k, host.get(k)) for k in ("start", "end"))}}
    return out


#: Foreign processes listed per host in ``cpu_hosts`` (the busiest).
FOREIGN_TOP = 10


def host_view(ranks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per host, the CPUs the job's ranks used and who used them over the run:
    ``cpu_hosts`` in trace.json.  ranks: {"rank", "host", "pid", "cpu" (the
    rank_doc block)} for each rank.

    The window is one rank's two readings (the widest pair on the host: every
    rank reads the same host-wide counters).  For each CPU of the ranks'
    affinities and their threads' last CPUs: its busy share of the window;
    the job's own share: the CPU time of every rank's threads (schedstat,
    end less start), each put on its last CPU, plus what the rank's process
    used beyond its threads (threads that came and went) on its own last CPU,
    plus the job's other processes (the ranks' children, recursively, and
    their launcher, the ranks' parent): their utime + stime on their last
    CPU; the foreign share: busy less the job's own (never below 0).  A
    thread that moved between CPUs counts on its last one: exact for ranks
    bound to their CPUs, an estimate otherwise (the sum over the job's CPUs
    stays right).  The foreign processes: the busiest processes outside the
    job whose last CPU is one of the job's (FOREIGN_TOP).  The job's ranks
    named as other hosts on the same kernel (boot_id: simulated hosts,
    containers on one node) and their children and launchers are the job
    too, never foreign.  Each host:

        {"host", "ranks": [{"rank", "pid", "cpus": [its affinity]}],
         "window_ns", "clk_tck", "reference_rank", "reason": "" | why not,
         "cpus": [{"cpu", "ranks", "busy_share", "job_share", "foreign_share",
                   "steal_share"}],
         "foreign": [{"pid", "ppid", "name", "cpu", "cpu_ns", "share"}],
         "job_pids": [...]}
    """
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for r in ranks:
        if isinstance(r.get("cpu"), Mapping):
            by_host.setdefault(str(r.get("host", "")), []).append(r)
    return [_safe_host(h, rs, _same_kernel(rs, ranks)) for h, rs in sorted(by_host.items())]


def boot_id(r: Mapping[str, Any]) -> str:
    """The kernel a rank ran on (its CPU block's host boot id), "" unknown:
    ranks named as different hosts on one kernel share its CPUs."""
    h = r["cpu"].get("host") if isinstance(r.get("cpu"), Mapping) else None
    b = h.get("boot_id") if isinstance(h, Mapping) else None
    return b if isinstance(b, str) else ""


def _same_kernel(mine: Sequence[Mapping[str, Any]],
                 ranks: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The job's ranks named as other hosts that run on the same kernel as
    these (the same boot id: network namespaces, containers on one node):
    they share the CPUs and are the job, never a neighbour."""
    boots = {boot_id(r) for r in mine} - {""}
    if not boots:
        return []
    ours = {id(r) for r in mine}
    return [r for r in ranks if id(r) not in ours and boot_id(r) in boots]


def _safe_host(host: str, ranks: Sequence[Mapping[str, Any]],
               also: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """_one_host, or a view that says why not: the sidecars are the ranks' own
    files, and a damaged one makes no view rather than a failed merge."""
    try:
        return _one_host(host, ranks, also)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        return {"host": host, "ranks": [], "window_ns": None, "clk_tck": None,
                "reference_rank": None, "cpus": [], "foreign": [], "job_pids": [],
                "reason": f"the host readings are malformed ({type(exc).__name__}: {exc})"}


def _one_host(host: str, ranks: Sequence[Mapping[str, Any]],
              also: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One host's view (host_view); `also`: the job's ranks named as other
    hosts on this kernel, whose processes and CPU time are the job's here."""
    view: dict[str, Any] = {
        "host": host, "ranks": [], "window_ns": None, "clk_tck": None,
        "reference_rank": None, "reason": "", "cpus": [], "foreign": [], "job_pids": []}
    pids: dict[int, int] = {}  # pid -> rank
    used_cpus: set[int] = set()
    rank_cpus: dict[int, set[int]] = {}
    for r in ranks:
        rank, cpu = int(r["rank"]), r["cpu"]
        pid = _int(r.get("pid"))
        if pid is not None:
            pids[pid] = rank
        aff = {int(c) for c in cpu.get("affinity") or [] if _int(c) is not None}
        last = {int(t[w]["last_cpu"]) for t in cpu.get("threads") or [] for w in ("start", "end")
                if isinstance(t.get(w), Mapping) and _int(t[w].get("last_cpu")) is not None}
        rank_cpus[rank] = aff or last
        used_cpus |= aff | last
        view["ranks"].append({"rank": rank, "pid": pid, "cpus": sorted(aff)})
    best: tuple[int, Mapping[str, Any], Mapping[str, Any]] | None = None
    for r in ranks:
        h = r["cpu"].get("host")
        if not isinstance(h, Mapping):
            continue
        a, b = h.get("start"), h.get("end")
        if not (isinstance(a, Mapping) and isinstance(b, Mapping) and a.get("cpus")
                and b.get("cpus") and a.get("t_ns") is not None and b.get("t_ns") is not None):
            continue
        span = int(b["t_ns"]) - int(a["t_ns"])
        if span > 0 and (best is None or span > best[0]):
            best = (span, r, h)
    if best is None:
        reasons = {str(r["cpu"]["host"].get("reason")) for r in ranks
                   if isinstance(r["cpu"].get("host"), Mapping) and r["cpu"]["host"].get("reason")}
        view["reason"] = ("; ".join(sorted(reasons)) or
                          "no rank read the host at start and at the end (a rank that died "
                          "before MPI_Finalize, or a profile from before the host was read)")
        return view
    span, ref, h = best
    clk = _int(ref["cpu"].get("clk_tck")) or 100
    tick_ns = 1e9 / clk
    view.update(window_ns=span, clk_tck=clk, reference_rank=int(ref["rank"]))
    procs = {int(p["pid"]): p for p in h.get("procs") or [] if isinstance(p, Mapping)}
    complete_start = not (h["start"].get("procs_omitted") or 0)

    def used_ns(p: Mapping[str, Any]) -> float | None:
        """Its CPU time between the readings (None: unknown)."""
        if p.get("end") is None:
            return None
        if p.get("start") is None:
            return float(p["end"]) * tick_ns if complete_start else None
        return max(float(p["end"]) - float(p["start"]), 0.0) * tick_ns

    # the job: the ranks (with those of other host names on this kernel),
    # their children (recursively) and their launchers
    job = set(pids) | {q for r in also if (q := _int(r.get("pid"))) is not None}
    launchers = {int(procs[p]["ppid"]) for p in job
                 if p in procs and (procs[p].get("ppid") or 0) > 1}
    grew = True
    while grew:
        kids = {q for q, p in procs.items() if p.get("ppid") in job and q not in job}
        grew = bool(kids)
        job |= kids
    job |= launchers
    own_ns: dict[int, float] = {}

    def put(cpu: Any, ns: float) -> None:
        if _int(cpu) is not None and ns > 0:
            own_ns[int(cpu)] = own_ns.get(int(cpu), 0.0) + ns
            used_cpus.add(int(cpu))

    for r in [*ranks, *also]:
        threads_ns, main_cpu = 0.0, None
        for t in r["cpu"].get("threads") or []:
            end, start = t.get("end"), t.get("start")
            if not isinstance(end, Mapping):
                continue
            d = float(end["cpu_ns"]) - float(start["cpu_ns"] if isinstance(start, Mapping) else 0)
            put(end.get("last_cpu"), d)
            threads_ns += max(d, 0.0)
            if t.get("kind") == "main":
                main_cpu = end.get("last_cpu")
        p = procs.get(_int(r.get("pid")) or -1)
        whole = used_ns(p) if p is not None else None
        if whole is not None and p is not None:
            put(main_cpu if main_cpu is not None else p.get("cpu"), whole - threads_ns)
    for q in job - set(pids):
        p = procs.get(q)
        ns = used_ns(p) if p is not None else None
        if p is not None and ns:
            put(p.get("cpu"), ns)
    a, b = ({int(c["cpu"]): c for c in h[w]["cpus"]} for w in ("start", "end"))
    for c in sorted(used_cpus):
        if c not in a or c not in b:
            continue
        ticks = {k: max(int(b[c][k]) - int(a[c][k]), 0) for k in ("busy", "idle", "steal")}
        total = ticks["busy"] + ticks["idle"] + ticks["steal"]
        if total <= 0:
            continue
        busy = ticks["busy"] / total
        mine = min(own_ns.get(c, 0.0) / (total * tick_ns), busy)
        view["cpus"].append({
            "cpu": c, "ranks": sorted(k for k, cs in rank_cpus.items() if c in cs),
            "busy_share": busy, "job_share": mine, "foreign_share": busy - mine,
            "steal_share": ticks["steal"] / total})
    on = {c["cpu"] for c in view["cpus"]}
    foreign = []
    for q, p in procs.items():
        ns = used_ns(p)
        if q in job or not ns or p.get("cpu") not in on:
            continue
        foreign.append({"pid": q, "ppid": p.get("ppid"), "name": p.get("name", ""),
                        "cpu": p.get("cpu"), "cpu_ns": int(ns), "share": ns / span})
    foreign.sort(key=lambda f: -f["cpu_ns"])
    view["foreign"] = foreign[:FOREIGN_TOP]
    view["job_pids"] = sorted(job)
    return view
