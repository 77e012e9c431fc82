"""Membership epochs of an elastic Horovod job: the sidecar each process writes
and the block trace.json carries.

The sidecar ``raw/rank-N.epochs.jsonl`` sits beside the process's raw file
``rank-N.hvprof`` (in an elastic job N is a number the process claimed, not a
rank: hooks/gloo.c).  One JSON object a line, appended and written at once
(one ``write`` each: a worker killed a moment later keeps every line before):

* ``{"event": "init", "t0_ns": .., "t1_ns": .., "rank": r, "size": s,
  "local_rank": l, "pid": p}`` -- hvd.init returned (t0: called, t1:
  returned), with the rank and size Horovod gave this process for the epoch;
* ``{"event": "shutdown", "t_ns": .., "pid": p}`` -- hvd.shutdown called
  (elastic: a reset begins).

Times are CLOCK_MONOTONIC ns (``time.monotonic_ns``), the clock the raw
header calibrates against, so that the merge puts them on the trace's axis
(profiler.formats.clock).  A last line cut short by a kill is skipped.

The trace's ``elastic`` block (profiler.postjob.epochs builds it):
``epochs`` (index, start_ns, end_ns, world_size, members: file, pid, rank;
steps and images/sec per member and in all), ``resets`` (from, to, kind,
failure_ns, first_step_ns, cost_ns, reinit_ns), ``processes`` (file, pid,
ended) and ``analysed`` (the epoch the trace's window holds).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["SUFFIX", "sidecar_of", "append", "read", "ENDED"]

#: The sidecar's name: the raw file's, with this in place of ".hvprof".
SUFFIX = ".epochs.jsonl"

#: How a process ended, as the merge can tell: exited (its raw file closed),
#: killed (never closed: SIGKILL, or a crash that skipped the exit work).
ENDED = ("exited", "killed")


def sidecar_of(raw_path: str | os.PathLike[str]) -> Path:
    """The epochs sidecar beside a raw file."""
    p = Path(raw_path)
    name = p.name[: -len(".hvprof")] if p.name.endswith(".hvprof") else p.name
    return p.with_name(name + SUFFIX)


def append(raw_path: str | os.PathLike[str], event: dict[str, Any]) -> None:
    """One line, in one write (O_APPEND)."""
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    fd = os.open(sidecar_of(raw_path), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The sidecar's events in order; [] without the file; lines that do not
    parse (a write cut short) are skipped."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") in ("init", "shutdown"):
            out.append(ev)
    return out
