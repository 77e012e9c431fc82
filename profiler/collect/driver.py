"""Horovod jobs that a driver process starts: ``horovod.ray.RayExecutor`` and
``horovod.spark.run``.

Ray and Spark end their workers without Python's exit work, so no rank
builds the trace and nothing says where the profile is, though each
worker's raw file is there to merge.  The driver is the one process that outlives
them: when a process started with HOROVOD_PROFILE imports ``horovod.ray`` or
``horovod.spark`` (profiler.collect.horovod_hooks notices), :func:`watch`
notes the time and registers :func:`finish`.  At the driver's exit, each
profile directory its workers wrote (HOROVOD_PROFILE_DIR when set, else every
``horovod-profile-*`` directory in its working directory, where a local Ray
cluster's workers write, whose raw files changed after the watch began) and
whose trace.json is missing or older than its raw files is merged, with the
usual line saying where.  A process that opened a raw file itself is a worker
(its workers import ``horovod.ray`` too): it merges nothing.  Workers on other
hosts write there, not here: ``profiler merge DIR`` there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_since: float | None = None
_cwd = ""


def watch() -> None:
    """Called on the import of horovod.ray or horovod.spark (idempotent)."""
    global _since, _cwd
    if _since is not None:
        return
    _since = time.time()
    _cwd = os.getcwd()
    import atexit

    atexit.register(finish)


def written_since(since: float, cwd: str) -> list[Path]:
    """The profile directories a driver's workers wrote after `since` that
    have no trace.json as new as their raw files (module doc)."""
    from profiler._env import text

    named = text("HOROVOD_PROFILE_DIR")
    if named:
        candidates = [Path(cwd, named)]
    else:
        try:
            candidates = sorted(p for p in Path(cwd).iterdir()
                                if p.name.startswith("horovod-profile-") and p.is_dir())
        except OSError:
            return []
    out = []
    for d in candidates:
        try:
            raws = [p.stat().st_mtime for p in (d / "raw").glob("*.hvprof")]
        except OSError:
            continue
        if not raws or max(raws) < since:
            continue
        trace = d / "trace.json"
        if trace.is_file() and trace.stat().st_mtime >= max(raws):
            continue
        out.append(d)
    return out


def finish() -> None:
    """At the driver's exit: merge what its workers left (module doc); one
    line each, never an exception."""
    from profiler.postjob.atexit import one_line, say

    try:
        from profiler.collect import native

        if native.loaded() is not None and native.profile_dir():
            return  # this process profiled: a worker, not the driver
        if _since is None:
            return
        found = written_since(_since, _cwd)
        if found:
            from profiler.postjob.atexit import allow_late_imports

            allow_late_imports()  # the merge imports pandas, after threading's shutdown
        for d in found:
            from profiler.postjob.merge import merge

            try:
                res = merge(str(d))
                say(f"trace written to {res.summary_line()} (merged at the driver's exit: "
                    "its workers ended without theirs)")
            except Exception as exc:
                say(f"warning: {d}: no trace built: {one_line(exc)}; profiler merge {d}")
    except KeyboardInterrupt:  # Ctrl-C while merging: the raw files stay
        say("interrupted: the workers' profile was not merged; profiler merge DIR builds it")
    except Exception as exc:  # never change the driver's exit
        say(f"warning: {one_line(exc)}")
