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
     "end": {...} | None}]}

cpu_ns / wait_ns / slices: the kernel's schedstat (ns on a CPU, ns waiting on
a run queue, timeslices); nvcsw / nivcsw: voluntary and involuntary context
switches (/proc/.../status); t_ns: when it was read, on the job axis (the
rows' time axis).  Thread kinds: "main" (tid = pid), "horovod" (the thread
whose track Horovod's library opened: rows' thread_kind "horovod"), "helper"
(the library's flush thread, hvprof-io), "watchdog" (the hang watchdog,
hvprof-watchdog), "other" (torch's and OpenMP's workers, the application's).
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
    if name == HELPER_NAME or (helper_tid and tid == helper_tid):
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
    }
