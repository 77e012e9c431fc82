"""The profiler's own cost in this process, measured where it is spent.

The Python hooks (tensor records from Horovod's entry points, the
DistributedOptimizer step hook) measure the time they spend after the code
they wrap returns (reading their arguments, writing the record).  After the
first MEASURE_FIRST invocations (all measured: the one-off costs are there)
one in SAMPLE_EVERY is measured; a sampled invocation stands for
SAMPLE_EVERY invocations at its work alone (what an unmeasured one costs),
plus the clock reads it made itself (every invocation is counted in
python_calls).

Each measured interval is read on two clocks (:func:`start`, :func:`close`):
the wall clock (time.perf_counter_ns: the vDSO, no system call), and around
it this thread's CPU clock (time.thread_time_ns: a system call, several times
dearer inside a training step than in a quiet loop).  The work is the
smaller of the two.  The wall interval holds the
work alone unless the thread waited for a core meanwhile (on a busy node
Horovod's background threads poll: a wait of a scheduler tick inside a
10-us hook happens often enough to double a wall-clock mean); the CPU
interval never holds a wait but holds parts of its own two system calls.
The estimate is an upper bound: a measured invocation runs its work right
after a system call, with colder caches than an unmeasured one.  The CPU
reads are
priced from one more read right after (:func:`close`).  What runs before
the hook's first read (the call into it) is not counted.  The C side
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

__all__ = ["add_python", "start", "close", "snapshot", "clock", "wall", "sample", "SAMPLE_EVERY"]

clock = time.thread_time_ns
wall = time.perf_counter_ns
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


def add_python(work_ns: int, paid_ns: int = 0) -> None:
    """Account one measured hook invocation: `work_ns` its work, `paid_ns`
    what its own clock reads cost.  Among the first MEASURE_FIRST it counts
    for itself (its work and its reads); after, for SAMPLE_EVERY
    invocations at its work alone, plus its own reads."""
    global python_ns
    work = max(0, work_ns)
    paid = max(0, paid_ns)
    python_ns += work + paid if python_calls <= MEASURE_FIRST else work * SAMPLE_EVERY + paid


def start() -> tuple[int, int]:
    """Open a measured interval: (thread CPU clock, then wall clock)."""
    c = clock()
    return c, wall()


def close(opened: tuple[int, int], before: int = 0) -> None:
    """End a measured invocation opened by :func:`start` after the wrapped
    call returned; `before`: the wall time of its work before the wrapped
    call (a few hundred ns: no wait to fear)."""
    w1 = wall()
    c1 = clock()
    read = clock() - c1
    by_wall = w1 - opened[1]
    by_cpu = c1 - opened[0] - read  # the interval holds about one read
    add_python(before + max(0, min(by_wall, by_cpu)), 3 * max(0, read))


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
    helper thread's CPU time, the per-step CPU reads (cpu_read_ns: the
    library's count, their rows included and so left out of `records`), the
    Python hooks' time; as a share of the rank's
    CPU time and of its step time.  Figures the run did not measure (an older
    library, a rank converted after the fact) are None, never guessed."""
    ranks: list[dict[str, Any]] = []
    for m in rank_meta:
        h = _dict(m.get("header"))
        own = _dict(m.get("self_cost"))
        per_call = _num(h.get("call_cost_ns"))
        # the per-step CPU samples (hooks/cpu.c): the library times their
        # reads and records on the stepping thread's CPU clock; those rows
        # are priced there, not at the per-record cost
        samples = _dict(m.get("cpu"))
        cpu_read = _num(samples.get("step_read_cpu_ns"))
        cpu_rows = int(_num(samples.get("rows")) or 0) if cpu_read is not None else 0
        records = max(0, int(_num(m.get("rows")) or 0) + int(_num(m.get("aggregated_calls")) or 0)
                      - cpu_rows)
        record_ns = per_call * records if per_call is not None else None
        helper = _num(h.get("helper_cpu_ns"))
        python = _num(own.get("python_hook_ns"))
        parts = [v for v in (record_ns, helper, python, cpu_read) if v is not None]
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
            "cpu_read_ns": cpu_read,
            "cpu_rows": cpu_rows,
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
                  "+ the helper thread's CPU time (its thread clock), + the per-step reads "
                  "of every thread's CPU figures with their rows (the stepping thread's "
                  "clock), + the Python hooks' "
                  "own time (sampled: each sample the smaller of its wall-clock and thread-clock "
                  "intervals, the clock reads priced; an upper bound); shares of "
                  "the rank's CPU time (getrusage at exit) and of its wall time (each step's "
                  "share when the cost spreads evenly over the run)",
    }
