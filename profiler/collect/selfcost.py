"""The profiler's own cost in this process, measured where it is spent.

The Python hooks (tensor records from Horovod's entry points, the
DistributedOptimizer step hook, TensorFlow's step hooks) measure the time they spend after the code
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
smaller of the two.  The wall interval holds the work alone unless the
thread waited for a core meanwhile (on a busy node Horovod's background
threads poll: a wait of a scheduler tick inside a 10-us hook happens often
enough to double a wall-clock mean); the CPU interval never holds a wait but
holds parts of its own two system calls.  The estimate is an upper bound: a
measured invocation runs its work right after a system call, with colder
caches than an unmeasured one.  The CPU reads are priced from one more read
right after (:func:`close`).  What runs before the hook's first read (the
call into it) is not counted.  The C hooks (profiler._fastrec) follow the
same rule from C, with the library's clock for the wall interval
(:func:`count_elsewhere`).  The library states its share in the raw file's
header: the per-call cost calibrated at start-up (call_cost_ns) and the
helper thread's CPU time (helper_cpu_ns).  :func:`snapshot` is written into
ranks/rank-R.json by the rank itself at exit (profiler.collect.facts), with
the process's CPU time to relate them to; the trace's summary of it all is
profiler.postjob.selfcost.job_summary.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any, Callable

__all__ = ["add_python", "start", "close", "snapshot", "clock", "wall", "sample", "SAMPLE_EVERY",
           "MEASURE_FIRST", "count_elsewhere", "note"]

clock = time.thread_time_ns
wall = time.perf_counter_ns
#: A measured invocation costs about 2 us more than another (four clock
#: reads, two Python calls): one in 64 keeps that under 0.5 us a step for a
#: model of 12 gradient tensors.
SAMPLE_EVERY = 64
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


def add_python(work_ns: int, paid_ns: int = 0, weight: int | None = None) -> None:
    """Account one measured hook invocation: `work_ns` its work, `paid_ns`
    what its own clock reads cost.  Among the first MEASURE_FIRST it counts
    for itself (its work and its reads); after, for SAMPLE_EVERY
    invocations at its work alone, plus its own reads.  `weight`: the
    invocations it stands for, from a hook that keeps its own count of the
    same rule (the C tensor hook: :func:`count_elsewhere`)."""
    global python_ns
    work = max(0, work_ns)
    paid = max(0, paid_ns)
    if weight is None:
        weight = 1 if python_calls <= MEASURE_FIRST else SAMPLE_EVERY
    python_ns += work * weight + paid


_counters: list[Callable[[], int]] = []
_work: list[Callable[[], int]] = []
_notes: dict[str, str] = {}


def note(key: str, text: str) -> None:
    """A fact about how the hooks run (the tensor hook's field reads), kept
    in :func:`snapshot` under `key`."""
    _notes[key] = text


def count_elsewhere(counter: Callable[[], int], work_ns: Callable[[], int]) -> None:
    """Invocations of hooks that sample by :func:`sample`'s rule with their
    own count, and the work they measured by :func:`close`'s rule (the C
    hooks: profiler._fastrec.calls, work_ns): added to python_calls and
    python_ns in :func:`snapshot`."""
    _counters.append(counter)
    _work.append(work_ns)


def start() -> tuple[int, int]:
    """Open a measured interval: (thread CPU clock, then wall clock)."""
    c = clock()
    return c, wall()


def close(opened: tuple[int, int], before: int = 0, weight: int | None = None) -> None:
    """End a measured invocation opened by :func:`start` after the wrapped
    call returned; `before`: the wall time of its work before the wrapped
    call (a few hundred ns: no wait to fear); `weight`: as :func:`add_python`."""
    w1 = wall()
    c1 = clock()
    read = clock() - c1
    by_wall = w1 - opened[1]
    by_cpu = c1 - opened[0] - read  # the interval holds about one read
    add_python(before + max(0, min(by_wall, by_cpu)), 3 * max(0, read), weight)


def snapshot() -> dict[str, Any]:
    """This process's figures so far: Python hooks (ns, invocations), the
    TensorFlow kernel hooks (ns, records; profiler.collect.tf_kernels) when
    they recorded, and the process's CPU time (user + system, all threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    tf = sys.modules.get("profiler.collect.tf_kernels")
    kernels = tf.cost() if tf is not None else None  # type: ignore[attr-defined]
    calls = python_calls + sum(int(c()) for c in _counters)
    work = python_ns + sum(int(w()) for w in _work)
    return {"python_hook_ns": int(work), "python_hook_calls": int(calls),
            **(kernels or {}), **_notes,
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
