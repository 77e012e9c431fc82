"""The hang watchdog: notices a collective in flight longer than
HOROVOD_PROFILE_HANG_S (default 120 s; 0 turns it off), or a tensor handed to
Horovod and not handed back for that long (profiler.collect.tensors: the
hang where one rank never submits a tensor and every MPI call completes), and
writes a hang snapshot into the profile directory, then says so in one line.  It never kills
or changes the job.

A daemon thread polls the library's flight recorder (hvprof_inflight_oldest_ns:
the age of this process's oldest call in flight) every few seconds.  When a
call is stuck it writes

    <dir>/hang/rank-R.json          when, which rank, how long in flight, the step
    <dir>/hang/rank-R.stacks.txt    the Python stacks of every thread (faulthandler)

and creates <dir>/hang/HANG.  Every rank's watchdog also looks for that marker
and then writes its own snapshot, so the ranks that are not in a collective
(the ones the others wait for) leave their stacks too.  The in-flight calls
themselves are in each rank's raw file; `profiler hang DIR` reads all of it.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from pathlib import Path

from profiler._env import read

HANG_ENV = "HOROVOD_PROFILE_HANG_S"
MARKER = "HANG"
# the thread's kernel name: profiler.formats.cpu.WATCHDOG_NAME gives it its kind
THREAD_NAME = "hvprof-watchdog"

_thread: threading.Thread | None = None


def hang_seconds() -> float:
    """HOROVOD_PROFILE_HANG_S (seconds; 0 = off)."""
    return float(read(HANG_ENV))


def start() -> None:
    """Start the watchdog thread (once per process; nothing when it is off)."""
    global _thread
    limit = hang_seconds()
    if limit <= 0 or _thread is not None:
        return
    _thread = threading.Thread(target=_loop, args=(limit,), name=THREAD_NAME,
                               daemon=True)
    _thread.start()


def _name_os_thread(name: str) -> None:
    """Give the calling thread its name in the kernel too (/proc/.../comm, 15
    bytes): Python's thread names stay inside Python, and the library's CPU
    figures (hooks/cpu.c) tell the threads apart by their kernel names."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except Exception:  # not Linux, no prctl: the thread keeps its inherited name
        pass


def _loop(limit: float) -> None:
    from profiler.collect import native

    _name_os_thread(THREAD_NAME)
    poll = min(5.0, max(0.2, limit / 4))
    oldest = native.function("hvprof_inflight_oldest_ns")
    if oldest is None:
        return
    fired = False
    while not fired:
        time.sleep(poll)
        try:
            directory = native.profile_dir()
            if not directory:
                continue
            hang = Path(directory) / "hang"
            age_s = int(oldest()) / 1e9
            tensor = _oldest_tensor()
            if tensor is not None and tensor[0] > limit and age_s <= limit:
                fired = True
                first = _mark(hang)
                path = snapshot(hang, native.rank(), tensor[0], f"tensor {tensor[1]} waiting")
                if first or native.rank() == 0:
                    print(f"horovod-profiler: rank {native.rank()}: tensor {tensor[1]} has "
                          f"waited in Horovod for {tensor[0]:.0f} s (HOROVOD_PROFILE_HANG_S="
                          f"{limit:g}); hang snapshot in {path.parent}; run: profiler hang "
                          f"{directory}", file=sys.stderr, flush=True)
            elif age_s > limit:
                fired = True
                first = _mark(hang)
                path = snapshot(hang, native.rank(), age_s, "in flight")
                if first or native.rank() == 0:
                    print(f"horovod-profiler: rank {native.rank()}: {_what_is_stuck()} has "
                          f"been in flight for {age_s:.0f} s (HOROVOD_PROFILE_HANG_S={limit:g}); "
                          f"hang snapshot in {path.parent}; run: profiler hang {directory}",
                          file=sys.stderr, flush=True)
            elif (hang / MARKER).exists():
                fired = True
                snapshot(hang, native.rank(), age_s, "another rank is stuck")
        except Exception as exc:  # noqa: BLE001 - a watchdog never breaks the job
            print(f"horovod-profiler: warning: rank {native.rank()}: the hang watchdog "
                  f"stopped: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return


def _what_is_stuck() -> str:
    """"MPI_RECV (point-to-point)", "MPI_ALLREDUCE (a collective)": the
    oldest call in flight, as the library's in-flight table says."""
    from profiler.collect import native
    from profiler.formats.record import OPS, P2P_OPS

    fn = native.function("hvprof_inflight_oldest_op")
    op = int(fn()) if fn is not None else 0
    entry = OPS.get(op)
    if not op or entry is None:
        return "a call"
    p2p = entry[1] in P2P_OPS or entry[1] in ("nccl_send", "nccl_recv")
    return f"{entry[0]} ({'point-to-point' if p2p else 'a collective'})"


def _oldest_tensor() -> tuple[float, str] | None:
    """The oldest tensor handed to Horovod and not handed back (seconds, name):
    by horovod.torch's entry points or by Horovod's TensorFlow kernels."""
    found = []
    for name in ("profiler.collect.tensors", "profiler.collect.tf_kernels"):
        # a module the main thread is still importing is in sys.modules without
        # its functions yet: nothing handed to Horovod through it so far
        fn = getattr(sys.modules.get(name), "oldest_pending", None)
        got = fn() if fn is not None else None
        if got is not None:
            found.append(got)
    return max(found, key=lambda f: f[0]) if found else None


def _mark(hang: Path) -> bool:
    """Create the marker; True when this process made it first."""
    hang.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(hang / MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def snapshot(hang: Path, rank: int, age_s: float, why: str) -> Path:
    """Write this rank's hang snapshot (metadata and every thread's Python stack)."""
    import json

    from profiler.collect import steps

    hang.mkdir(parents=True, exist_ok=True)
    stem = f"rank-{rank:05d}"
    with open(hang / f"{stem}.stacks.txt", "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    doc = {"rank": rank, "pid": os.getpid(), "time": time.time(), "why": why,
           "oldest_in_flight_s": age_s, "steps_recorded": steps.steps_recorded()}
    out = hang / f"{stem}.json"
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(out)
    return out
