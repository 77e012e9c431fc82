"""The profiler's own cost in this process, measured where it is spent.

The Python hooks (tensor records from Horovod's entry points, the
DistributedOptimizer step hook) measure the time they spend after the code
they wrap returns (reading their arguments, writing the record), as this
thread's CPU time (time.thread_time_ns): wall time would count the time the
thread waits for a core, which on a busy node (Horovod's background threads
poll) is many times the work.  A thread-clock read is a system call: 1 us
in a quiet loop on this project's VM, about 6 us inside a training step,
where the hook itself runs with cold caches (measured in a resnet18 job:
30-34 us of work per tensor there, 5 us in a warm loop).  So after the
first MEASURE_FIRST invocations (all measured: the one-off costs are there)
one in SAMPLE_EVERY is measured, and the reads are priced, not counted as
work: the interval between two reads holds one read's cost, which one
more read right after gives (:func:`close`).  A sampled invocation then stands
for SAMPLE_EVERY invocations at its work alone (what an unmeasured one
costs), plus the reads it made itself (an unbiased estimate of the
steady state; every invocation is counted in python_calls).  What runs
before the hook's first read (the call into it) is not counted: measured
in a warm loop, the estimate is 0.6 us under the 5.4 us a hook costs.  The C side
states its share in the raw file's header: the per-call cost calibrated at
start-up (call_cost_ns) and the helper thread's CPU time (helper_cpu_ns).
:func:`snapshot` is written into ranks/rank-R.json by the rank itself at
exit (profiler.collect.convert), with the process's CPU time to relate them
to.
"""

from __future__ import annotations

import resource
import time
from typing import Any

__all__ = ["add_python", "close", "snapshot", "clock", "sample", "SAMPLE_EVERY"]

clock = time.thread_time_ns
SAMPLE_EVERY = 16
python_ns = 0
python_calls = 0


#: The first invocations are all measured (one-off costs: imports, opening
#: the names file, a name's first write), then one in SAMPLE_EVERY.
MEASURE_FIRST = 256


def sample() -> bool:
    """Count one hook invocation; True when this one is to be measured."""
    global python_calls
    python_calls += 1
    return python_calls <= MEASURE_FIRST or python_calls % SAMPLE_EVERY == 0


def add_python(ns: int, read_ns: int = 0, intervals: int = 1, reads: int = 3) -> None:
    """Account one measured hook invocation: `ns` its CPU time over
    `intervals` intervals each between two thread-clock reads (each holds one
    read's cost), `read_ns` one read's cost, `reads` the reads it made.
    Among the first MEASURE_FIRST it counts for itself (its work and its
    reads); after, for SAMPLE_EVERY invocations at its work alone, plus its
    own reads."""
    global python_ns
    work = max(0, ns - intervals * read_ns)
    paid = reads * max(0, read_ns)
    python_ns += work + paid if python_calls <= MEASURE_FIRST else work * SAMPLE_EVERY + paid


def close(opened: int, before: int = 0) -> None:
    """End a measured invocation: its work after the wrapped call began at
    ``opened = clock()``; `before`, when given, is the interval between two
    reads around its work before the wrapped call."""
    c1 = clock()
    read = clock() - c1
    if before:
        add_python(before + c1 - opened, read, intervals=2, reads=5)
    else:
        add_python(c1 - opened, read)


def snapshot() -> dict[str, Any]:
    """This process's figures so far: Python hooks (ns, invocations) and the
    process's CPU time (user + system, all threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"python_hook_ns": int(python_ns), "python_hook_calls": int(python_calls),
            "process_cpu_ns": int((ru.ru_utime + ru.ru_stime) * 1e9),
            "process_wall_ns": _process_wall_ns()}


def _process_wall_ns() -> int | None:
    """How long this process has run (Linux: /proc), None when unknown."""
    import os

    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0, int((up - start / os.sysconf("SC_CLK_TCK")) * 1e9))
    except (OSError, ValueError, IndexError):
        return None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _num(v: Any) -> float | None:
    """A positive finite number from rank metadata, else None (absent, 0 =
    not measured, or not a number: metadata edited by hand is not trusted)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if f > 0 and f != float("inf") else None


def job_summary(rank_meta: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace metadata's ``self_cost``: per rank and for the job, what the
    profiler cost this run: records x the calibrated cost per record, the
    helper thread's CPU time, the Python hooks' time; as a share of the rank's
    CPU time and of its step time.  Figures the run did not measure (an older
    library, a rank converted after the fact) are None, never guessed."""
    ranks: list[dict[str, Any]] = []
    for m in rank_meta:
        h = _dict(m.get("header"))
        own = _dict(m.get("self_cost"))
        per_call = _num(h.get("call_cost_ns"))
        records = int(_num(m.get("rows")) or 0) + int(_num(m.get("aggregated_calls")) or 0)
        record_ns = per_call * records if per_call is not None else None
        helper = _num(h.get("helper_cpu_ns"))
        python = _num(own.get("python_hook_ns"))
        parts = [v for v in (record_ns, helper, python) if v is not None]
        total = float(sum(parts)) if parts else None
        cpu = _num(own.get("process_cpu_ns"))
        # each step's share: the cost spread evenly over the process's life
        # (records, hooks and the helper's ticks all run throughout)
        wall = _num(own.get("process_wall_ns"))
        ranks.append({
            "rank": int(m.get("rank", -1)),
            "call_cost_ns": per_call,
            "records": records,
            "record_ns": record_ns,
            "helper_cpu_ns": helper,
            "python_hook_ns": python,
            "python_hook_calls": _num(own.get("python_hook_calls")),
            "total_ns": total,
            "process_cpu_ns": cpu,
            "cpu_share": (total / cpu) if total is not None and cpu else None,
            "step_share": (total / wall) if total is not None and wall else None,
        })
    shares = [r["cpu_share"] for r in ranks if r["cpu_share"] is not None]
    steps_sh = [r["step_share"] for r in ranks if r["step_share"] is not None]
    costs = [r["call_cost_ns"] for r in ranks if r["call_cost_ns"] is not None]
    return {
        "ranks": ranks,
        "call_cost_ns": max(costs) if costs else None,
        "cpu_share_max": max(shares) if shares else None,
        "step_share_max": max(steps_sh) if steps_sh else None,
        "total_ns": sum(r["total_ns"] for r in ranks if r["total_ns"] is not None) or None,
        "method": "records x the per-record cost calibrated at start-up (call_cost_ns), "
                  "+ the helper thread's CPU time (its thread clock), + the Python hooks' "
                  "own CPU time (their thread clock, sampled, its reads priced); shares of "
                  "the rank's CPU time (getrusage at exit) and of its wall time (each step's "
                  "share when the cost spreads evenly over the run)",
    }
