"""The job record at exit: where a site keeps a store (HOROVOD_PROFILE_STORE,
set by its activation), after the exit merge wrote trace.json, rank 0's
merge child starts `python -m profiler.site.record DIR` (a layer above the
analysis, which this stage never imports) and waits for it at most
HOROVOD_PROFILE_RECORD_TIMEOUT seconds, then ends it.  Without a store no
record is made at exit (it costs an advise run, about a second of CPU and
a few seconds of the job's end): `profiler jobs ingest DIR` makes it later.  Whatever happens, the
job's results and exit status are untouched and at most one line is said:
the record's own ("horovod-profiler: ...", relayed as it is) or this one's."""

from __future__ import annotations

import os
import subprocess
import sys


def record_timeout() -> float:
    from profiler._env import read

    return float(read("HOROVOD_PROFILE_RECORD_TIMEOUT"))


def record_at_exit(directory: str, say: object = None) -> None:
    """Make the job record of the profile in `directory` (bounded, never raises);
    `say`: the exit stage's one-line printer.  No store or a timeout of 0: none."""
    def line(text: str) -> None:
        if callable(say):
            say(text)

    try:
        timeout = record_timeout()
        from profiler._env import text

        if timeout <= 0 or not text("HOROVOD_PROFILE_STORE"):
            return
        child = subprocess.Popen([sys.executable, "-m", "profiler.site.record", directory],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 start_new_session=True, close_fds=True)
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            child.wait()
            line(f"no job record: it took longer than {timeout:g} s "
                 f"(HOROVOD_PROFILE_RECORD_TIMEOUT); make it later with: profiler jobs ingest "
                 f"{directory}")
    except Exception as exc:  # noqa: BLE001 - the job's exit is never the record's
        line(f"no job record: {' '.join(str(exc).split())[:200]}; make it later with: "
             f"profiler jobs ingest {directory}")
